"""probe/life.py: a process's state and identity from /proc/PID/stat (probe/process's
parser, which carries its start time), cmdline and exe, on known text, on a fake
machine and on this process."""

from __future__ import annotations

import os

from starvecheck.probe.life import read_life
from starvecheck.probe.process import parse_stat
from starvecheck.probe.sysroot import SysRoot

STAT = "4242 (python (my) job) T 1 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 98765 1000"


def test_the_state_and_start_time_after_the_last_parenthesis():
    stat = parse_stat(STAT)
    assert stat is not None and (stat.state, stat.start) == ("T", 98765)
    short = parse_stat("12 (x) R 1 12 12 0 -1 4194560 100 0 0 0 5 6")
    assert short is not None and short.start is None


def test_a_fake_machines_stopped_process(tmp_path):
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "stat").write_text(STAT)
    (proc / "cmdline").write_text("python\0train.py\0")
    life = read_life(4242, SysRoot(tmp_path))
    assert life is not None and life.stopped and not life.ended
    assert life.cmdline == "python train.py" and life.exe is None
    assert read_life(4243, SysRoot(tmp_path)) is None


def test_this_process_runs_and_is_itself():
    a, b = read_life(os.getpid()), read_life(os.getpid())
    assert a is not None and b is not None and a.state in "RS"
    assert a.replaced_by(b) is None


def test_an_exiting_process_with_no_command_line_left_is_not_a_new_command():
    from starvecheck.probe.life import Life

    first = Life("S", 7, "/usr/bin/python3", "python train.py")
    assert first.replaced_by(Life("R", 7, None, "")) is None
    assert first.replaced_by(Life("S", 7, "/usr/bin/python3", "python other.py")) == (
        "changed command"
    )
    assert first.replaced_by(Life("S", 8, None, None)) == "PID reused"
