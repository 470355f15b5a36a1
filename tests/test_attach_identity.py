"""`attach --every` watches one job, not one number (issue 58; probe/life.py,
cli/windows.py): the job's start time, program, PID namespace and program image are
read before the first window and checked after each; a PID reused by another process,
or an exec, ends the watch in one line, and no window of it is reported. Window lines
that cannot be written are dropped and the report is still written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from starvecheck.cli.windows import _replaced
from starvecheck.probe.life import Life, read_life
from starvecheck.probe.sysroot import SysRoot
from tests.loops.loopstate import stop_tree

LOOP = Path(__file__).parent / "loops" / "attach_loop.py"
CMD = "python train.py"
JOB = Life("S", 1000, "/usr/bin/python3.11", CMD, "pid:[4026531836]", "aa")


@pytest.mark.parametrize(
    ("now", "said"),
    [
        (JOB, None),
        (Life("S", 1001, JOB.exe, CMD, JOB.pidns, JOB.image), "its start time is not the job's"),
        (Life("S", 1000, JOB.exe, CMD, "pid:[4026532000]", JOB.image), "another PID namespace"),
        (Life("S", 1000, "/usr/bin/sleep", CMD, JOB.pidns, "bb"), "runs another program now"),
        (Life("S", 1000, JOB.exe, CMD, JOB.pidns, "bb"), "it called exec"),
        (Life("S", None, None, None, None, None), None),  # nothing readable: nothing compared
        (Life("S", 1000, JOB.exe, CMD, None, None), None),
    ],
)
def test_what_tells_another_process_under_the_pid(now, said):
    why = _replaced(JOB, now)
    assert (why is None) if said is None else (said in why)


def test_an_upgraded_binary_is_the_same_program(tmp_path):
    root = tmp_path / "root"
    proc = root / "proc" / "7"
    proc.mkdir(parents=True)
    (proc / "stat").write_text("7 (python) S 1 7 7 0 -1 0 0 0 0 0 5 3 0 0 20 0 1 0 4242 0 0\n")
    (proc / "exe").symlink_to("/usr/bin/python3.11 (deleted)")
    got = read_life(7, SysRoot(root))
    assert got == Life("S", 4242, "/usr/bin/python3.11", None, None, None)
    (proc / "stat").write_text("7 (python) Z 1 7 7 0 -1 0 0 0 0 0 5 3 0 0 20 0 1 0 4242 0 0\n")
    got = read_life(7, SysRoot(root))
    assert got is not None and got.ended  # a zombie: the job ended
    assert read_life(8, SysRoot(root)) is None


def test_this_process_reads_the_same_twice_and_a_child_differs():
    me = read_life(os.getpid(), SysRoot.from_environ({}))
    assert me is not None and me.start is not None and me.image is not None
    assert _replaced(me, read_life(os.getpid(), SysRoot.from_environ({}))) is None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.2)
        other = read_life(child.pid, SysRoot.from_environ({}))
        assert other is not None and other.image != me.image
    finally:
        child.kill()
        child.wait()


def _started(state: Path, proc: subprocess.Popen) -> None:
    deadline = time.time() + 90
    while not state.exists():
        assert proc.poll() is None and time.time() < deadline, "the loop never started"
        time.sleep(0.1)


REUSE = textwrap.dedent(
    """
    # PID 1 of a private PID namespace: a job, attach --every on it, the job killed
    # and its PID given to another process (ns_last_pid), which attach must not report.
    import json, os, subprocess, sys, time
    loop, out = sys.argv[1], sys.argv[2]
    state = os.path.join(out, "state.json")
    job = subprocess.Popen([sys.executable, loop, "data", state])
    deadline = time.time() + 90
    while not os.path.exists(state) and time.time() < deadline:
        time.sleep(0.1)
    attach = subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "attach", str(job.pid), "--every", "8",
         "--duration", "2", "--json", os.path.join(out, "last.json")],
        stderr=subprocess.PIPE, text=True)
    first = attach.stderr.readline()  # window 1 read; attach sleeps to the next
    job.kill()
    job.wait()
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(job.pid - 1))
    other = subprocess.Popen([sys.executable, loop, "data", os.path.join(out, "other.json")])
    try:
        _, err = attach.communicate(timeout=120)
    finally:
        other.kill()
    print(json.dumps({"job": job.pid, "other": other.pid, "first": first, "err": err,
                      "rc": attach.returncode}))
    """
)


@pytest.mark.slow
def test_a_pid_reused_in_a_private_pid_namespace_ends_the_watch_unreported(tmp_path):
    """Before: attach went on reading the process that got the job's PID, and reported
    it as the job."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare here")
    probe = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip("no private PID namespace here (unshare --pid refused)")
    script = tmp_path / "reuse.py"
    script.write_text(REUSE)
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, str(script), str(LOOP),
         str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["other"] == got["job"], got  # the PID was reused
    assert "attach window 1" in got["first"], got
    err = got["err"]
    assert "attach window 2" not in err, err
    assert (
        f"starvecheck: attach: PID {got['job']} is no longer the job attach watched: another "
        "process has its PID now (its start time is not the job's); the watch ends with "
        "window 1, the last of the job"
    ) in err, err
    assert got["rc"] in (0, 1) and "Traceback" not in err
    report = json.loads((tmp_path / "last.json").read_text())
    assert report["stages"][0]["parameters"]["seconds"] > 0


@pytest.mark.slow
def test_an_exec_ends_the_watch_in_one_line(tmp_path):
    """The exec loop execs into a Python without torch that sleeps: the same binary
    and start time, a new program image."""
    state = tmp_path / "state.json"
    loop = subprocess.Popen([sys.executable, str(LOOP), "exec", str(state)], start_new_session=True)
    side = None
    try:
        _started(state, loop)
        cmd = [sys.executable, "-m", "starvecheck", "attach", str(loop.pid), "--every", "8",
               "--duration", "2", "--json", str(tmp_path / "last.json")]  # fmt: skip
        side = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
        assert side.stderr is not None
        assert "attach window 1" in side.stderr.readline()
        os.kill(loop.pid, signal.SIGUSR1)
        _, err = side.communicate(timeout=120)
        assert "attach window 2" not in err, err
        assert f"PID {loop.pid} is no longer the job attach watched: it called exec" in err, err
        assert side.returncode in (0, 1) and "Traceback" not in err
        assert (tmp_path / "last.json").stat().st_size > 0
    finally:
        stop_tree(loop)
        if side is not None and side.poll() is None:
            side.kill()
            side.wait()


@pytest.mark.slow
def test_a_closed_stderr_drops_the_window_lines_and_the_report_is_written(tmp_path):
    """Before: with its stderr closed attach ended with no report."""
    state = tmp_path / "state.json"
    loop = subprocess.Popen([sys.executable, str(LOOP), "data", str(state)], start_new_session=True)
    try:
        _started(state, loop)
        last = tmp_path / "last.json"
        side = subprocess.Popen(
            [sys.executable, "-m", "starvecheck", "attach", str(loop.pid), "--every", "3",
             "--duration", "2", "--json", str(last)],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert side.stderr is not None
        time.sleep(1.0)
        side.stderr.close()  # its log reader gone: each window line meets a broken pipe
        time.sleep(7)
        stop_tree(loop)
        side.wait(120)
        assert side.returncode in (0, 1)
        assert json.loads(last.read_text())["stages"][0]["stage"] == "attach"
    finally:
        stop_tree(loop)
