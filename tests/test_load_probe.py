"""probe/load.py's readings the worker model's bound uses: the load average and the
machine's CPU beside ours, from known text and fake roots, and never raising on
garbage."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from starvecheck.probe import load
from starvecheck.probe.sysroot import SysRoot


def test_the_load_average_is_the_first_field():
    assert load.parse_loadavg("6.93 7.41 5.20 9/812 31337\n") == 6.93
    assert load.parse_loadavg("") is None
    assert load.parse_loadavg("nan 1 1") is None and load.parse_loadavg("-1 0 0") is None


def test_the_load_average_of_a_fake_machine_and_of_none(tmp_path: Path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "loadavg").write_text("12.50 3.00 1.00 1/2 3\n")
    assert load.load_average(SysRoot(tmp_path)) == 12.5
    assert load.load_average(SysRoot(tmp_path / "nothing")) is None


def test_a_sample_without_run_queues_reads_none():
    s = load.sample([os.getpid()], runq=False)
    assert s.ours_runq is None and s.ours_cpu is not None and s.machine is not None
    assert load.sample([os.getpid()]).ours_runq is not None or not os.path.exists(
        f"/proc/{os.getpid()}/task"
    )


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_no_load_parser_raises(garbage):
    load.parse_loadavg(garbage)
    load.parse_proc_stat(garbage)
    load.parse_proc_stat(garbage, {0, 1})
    load.parse_pid_stat(garbage)
    load.parse_schedstat(garbage)
    load.parse_throttled(garbage)


STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 50 0 0 0 0 0 0
cpu1 200 0 50 550 0 0 0 0 0 0
intr 1 2 3
"""


def test_the_machine_on_the_cpus_a_process_may_use():
    whole = load.parse_proc_stat(STAT)
    assert whole is not None and whole.busy == 400 * load.TICK_S
    one = load.parse_proc_stat(STAT, {0})
    assert one is not None and one.busy == 150 * load.TICK_S and one.idle == 50 * load.TICK_S
    both = load.parse_proc_stat(STAT, {0, 1})
    assert both is not None and both.busy == whole.busy
    assert load.parse_proc_stat(STAT, {0, 7}) is None  # a CPU it cannot read: unknown


def test_allowed_cpus_are_none_where_a_process_may_use_every_cpu():
    allowed = load.allowed_cpus()
    assert allowed is None or 0 < len(allowed) < (os.cpu_count() or 0)


def test_a_reading_is_bounded_by_the_cpus_it_is_of(monkeypatch):
    assert load.cpus_read(frozenset({0, 3})) == 2
    monkeypatch.setattr(load.os, "cpu_count", lambda: 8)
    assert load.cpus_read(None) == 8
    assert load.at_most_cpus(9.5, None) == 8 and load.at_most_cpus(1.25, None) == 1.25
    assert load.at_most_cpus(3.0, frozenset({0, 3})) == 2
    monkeypatch.setattr(load.os, "cpu_count", lambda: None)  # unknown: nothing to bound by
    assert load.cpus_read(None) == 0 and load.at_most_cpus(9.5, None) == 9.5


GRANDCHILD = """
import os, time
pid = os.fork()
if pid == 0:  # the grandchild: 0.5 s of CPU, then alive a while, then gone
    t = time.process_time()
    while time.process_time() - t < 0.5:
        pass
    time.sleep(1.0)
    os._exit(0)
os.waitpid(pid, 0)  # reaped by the child, not by the test: its time is the child's now
time.sleep(30)
"""


def test_our_cpu_keeps_a_grandchild_reaped_by_its_parent():
    """A forkserver's workers are the fork server's children: when one exited, its CPU
    left the count of ours, and `loader --factory` read 47.8 of 2 CPUs as others'."""
    import subprocess
    import sys
    import time

    from starvecheck.probe.load import ours_cpu

    child = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
    try:
        time.sleep(0.9)
        alive = ours_cpu()
        time.sleep(1.2)
        gone = ours_cpu()
        assert alive is not None and gone is not None
        assert gone >= alive - 0.05, (alive, gone)
    finally:
        child.kill()
        child.wait(5)


def test_a_processs_cpu_and_run_queue_are_summed_over_its_threads(tmp_path):
    import pytest

    for tid, line in ((7, "2000000000 500000000 9\n"), (8, "250000000 1000000 3\n")):
        d = tmp_path / "proc" / "7" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "schedstat").write_text(line)
    root = SysRoot(tmp_path)
    assert load.on_cpu_seconds(7, root) == pytest.approx(2.25)  # the feeder thread's too
    assert load.runq_seconds(7, root) == pytest.approx(0.501)
    assert load.on_cpu_seconds(8, root) is None  # no such process
