"""attach's /proc and cgroup readings: throttling is read where the quota is enforced
(a pod's quota above its container's), and the readings of a live process."""

from __future__ import annotations

import os

import pytest

from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.attach.readings import cgroup_dir, snapshot


def _cg(base, d, cpu_max=None):
    os.makedirs(base / d.lstrip("/"), exist_ok=True)
    stat = "usage_usec 10\nnr_periods 5\nnr_throttled 1\nthrottled_usec 7\n"
    (base / d.lstrip("/") / "cpu.stat").write_text(stat)
    if cpu_max is not None:
        (base / d.lstrip("/") / "cpu.max").write_text(cpu_max + "\n")


def _v2(base, path):
    (base / "proc/self").mkdir(parents=True)
    (base / "proc/self/mountinfo").write_text(
        "30 1 0:20 / / rw - ext4 /dev/sda1 rw\n"
        "31 30 0:21 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    )
    (base / "proc/9").mkdir(parents=True)
    (base / "proc/9/cgroup").write_text(f"0::{path}\n")


def test_the_pods_quota_above_the_container_is_where_throttling_is_read(tmp_path):
    _v2(tmp_path, "/kubepods/pod1/ctr")
    cg = "/sys/fs/cgroup"
    _cg(tmp_path, cg), _cg(tmp_path, f"{cg}/kubepods", "max 100000")
    _cg(tmp_path, f"{cg}/kubepods/pod1", "200000 100000")
    _cg(tmp_path, f"{cg}/kubepods/pod1/ctr", "max 100000")
    assert cgroup_dir(9, SysRoot(tmp_path)) == f"{cg}/kubepods/pod1"


def test_the_tightest_quota_wins_and_no_quota_means_the_processs_own(tmp_path):
    _v2(tmp_path, "/pod/ctr")
    cg = "/sys/fs/cgroup"
    _cg(tmp_path, cg), _cg(tmp_path, f"{cg}/pod", "400000 100000")
    _cg(tmp_path, f"{cg}/pod/ctr", "50000 100000")
    assert cgroup_dir(9, SysRoot(tmp_path)) == f"{cg}/pod/ctr"
    (tmp_path / "sys/fs/cgroup/pod/ctr/cpu.max").write_text("max 100000\n")
    (tmp_path / "sys/fs/cgroup/pod/cpu.max").write_text("max\n")
    assert cgroup_dir(9, SysRoot(tmp_path)) == f"{cg}/pod/ctr"


def test_a_live_process_is_read_and_its_cgroup_has_a_cpu_stat():
    s = snapshot(os.getpid(), uss=True)
    assert s is not None and s.cpu_s is not None and s.cpu_s > 0
    assert s.uss is not None and s.uss > 1 << 20
    where = cgroup_dir(os.getpid())
    assert where is None or os.path.isfile(os.path.join(where, "cpu.stat"))
    assert snapshot(2**22 + 12345) is None  # no such process


def test_workers_are_counted_by_identity_across_an_epoch():
    # epoch 1's worker ends, epoch 2's starts: one worker at a time, never two
    import subprocess
    from types import SimpleNamespace

    from starvecheck.stages.attach.readings import Series, Snapshot, Watch
    from starvecheck.stages.attach.stage import read_procs
    from starvecheck.stages.attach.target import Process

    old = subprocess.Popen(["sleep", "30"])
    new = None
    try:
        w = Watch({os.getpid(): [old.pid]}, None)
        old.kill()
        old.wait()
        new = subprocess.Popen(["sleep", "30"])
        w.add(new.pid, os.getpid())
        w.tick()
        assert w.most_alive([old.pid, new.pid]) == 1
        assert w.series[old.pid].from_start and not w.series[new.pid].from_start
    finally:
        if new is not None:
            new.kill()
            new.wait()
    # a worker that started inside the window grew from its own first reading, which
    # is not growth: only one read from the window's start is
    mib = 1 << 20

    def series(uss0: int, uss1: int, from_start: bool) -> Series:
        a, b = Snapshot(0.0, 1.0, uss=uss0), Snapshot(8.0, 2.0, uss=uss1)
        return Series(a, b, from_start=from_start)

    watch = SimpleNamespace(series={1: series(200 * mib, 205 * mib, True),
                                    2: series(1 * mib, 71 * mib, False)})  # fmt: skip
    got = read_procs(Process(9, "python"), [1, 2], watch)  # type: ignore[arg-type]
    assert got.worker_uss_growth is not None and got.worker_uss_growth.value == 5 * mib


def test_workers_of_two_epochs_are_read_per_second_of_the_window():
    # A 30 s window: epoch 1's worker lives 0-15 s, epoch 2's 17-30 s, each a CPU busy.
    # The workers' CPUs are their CPU over the 30 s (0.93), not over the longest
    # life (15 s: 1.87, more than one worker at a time can use).
    from types import SimpleNamespace

    from starvecheck.stages.attach.readings import Series, Snapshot
    from starvecheck.stages.attach.stage import read_procs
    from starvecheck.stages.attach.target import Process

    def series(start: float, end: float, cpu: float) -> Series:
        return Series(Snapshot(start, 0.0, runq_s=0.0), Snapshot(end, cpu, runq_s=0.0))

    main = Series(Snapshot(0.0, 0.0, 0.0), Snapshot(30.0, 18.0, 9.0))
    watch = SimpleNamespace(series={9: main, 1: series(0.0, 15.0, 15.0),
                                    2: series(17.0, 30.0, 13.0)})  # fmt: skip
    got = read_procs(Process(9, "python"), [1, 2], watch)  # type: ignore[arg-type]
    assert got.workers_cpus is not None and got.main_cpus is not None
    assert got.workers_cpus.value == pytest.approx(28.0 / 30.0, abs=1e-4)
    assert got.main_cpus.value == pytest.approx(0.6, abs=1e-4)
