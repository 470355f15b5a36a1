"""attach's /proc and cgroup readings: throttling is read where the quota is enforced
(a pod's quota above its container's), and the readings of a live process."""

from __future__ import annotations

import os

from starvecheck.stages.attach.readings import _quota_dir, cgroup_dir, snapshot


def _cg(d, cpu_max=None):
    os.makedirs(d, exist_ok=True)
    (d / "cpu.stat").write_text("usage_usec 10\nnr_periods 5\nnr_throttled 1\nthrottled_usec 7\n")
    if cpu_max is not None:
        (d / "cpu.max").write_text(cpu_max + "\n")


def test_the_pods_quota_above_the_container_is_where_throttling_is_read(tmp_path):
    root = tmp_path / "cg"
    pod, leaf = root / "kubepods" / "pod1", root / "kubepods" / "pod1" / "ctr"
    _cg(root), _cg(root / "kubepods", "max 100000"), _cg(pod, "200000 100000")
    _cg(leaf, "max 100000")
    assert _quota_dir(str(leaf), str(root)) == str(pod)


def test_the_tightest_quota_wins_and_no_quota_means_the_processs_own(tmp_path):
    root = tmp_path / "cg"
    pod, leaf = root / "pod", root / "pod" / "ctr"
    _cg(root), _cg(pod, "400000 100000"), _cg(leaf, "50000 100000")
    assert _quota_dir(str(leaf), str(root)) == str(leaf)
    (leaf / "cpu.max").write_text("max 100000\n")
    (pod / "cpu.max").write_text("max\n")
    assert _quota_dir(str(leaf), str(root)) == str(leaf)


def test_a_live_process_is_read_and_its_cgroup_has_a_cpu_stat():
    s = snapshot(os.getpid(), uss=True)
    assert s is not None and s.cpu_s is not None and s.cpu_s > 0
    assert s.uss is not None and s.uss > 1 << 20
    where = cgroup_dir(os.getpid())
    assert where is None or os.path.isfile(os.path.join(where, "cpu.stat"))
    assert snapshot(2**22 + 12345) is None  # no such process
