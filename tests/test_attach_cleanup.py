"""`attach` leaves nothing behind, however it ends: a real attach on a real loop
(tests/loops/attach_loop.py), started as a process of its own with its own TMPDIR, ended
by SIGKILL, SIGTERM or Ctrl-C while py-spy samples. Its py-spy goes with it (a
parent-death signal; its process group ended on every other way out); after SIGKILL its
scratch directory stays and `starvecheck clean TMPDIR` proves it ours and removes it,
after SIGTERM and SIGINT nothing is there. The loop runs on, untraced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import run
from tests.loops.loopstate import stop_tree

LOOP = Path(__file__).parent / "loops" / "attach_loop.py"
GONE_WITHIN_S = 5.0  # a deadline to wait for, not a figure asserted


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    path = tmp_path_factory.mktemp("loop") / "state.json"
    p = subprocess.Popen([sys.executable, str(LOOP), "steady", str(path)], start_new_session=True)
    deadline = time.time() + 90
    while not path.exists():
        assert p.poll() is None, "the loop exited"
        assert time.time() < deadline, "the loop never started"
        time.sleep(0.1)
    yield p
    stop_tree(p)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _sampling(attach: subprocess.Popen[str], tmp: Path) -> list[psutil.Process]:
    """attach's py-spys, once they run and its scratch directory is there."""
    deadline = time.time() + 120
    while time.time() < deadline:
        assert attach.poll() is None, attach.communicate()
        try:
            spies = [k for k in psutil.Process(attach.pid).children() if "py-spy" in k.name()]
        except psutil.Error:
            spies = []
        if spies and list(tmp.glob("starvecheck-attach-*")):
            return spies
        time.sleep(0.05)
    raise AssertionError("attach's py-spy never started")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_attach_ended_any_way_leaves_nothing_behind(
    loop: subprocess.Popen[bytes], tmp_path: Path, signum: int
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "starvecheck", "attach", str(loop.pid), "--duration", "60"]
    attach = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        spies = _sampling(attach, tmp)
        attach.send_signal(signum)
        _, err = attach.communicate(timeout=60)
    finally:
        if attach.poll() is None:
            attach.kill()
            attach.wait()
    deadline = time.time() + GONE_WITHIN_S
    while any(_alive(s) for s in spies) and time.time() < deadline:
        time.sleep(0.05)
    assert not [s.pid for s in spies if _alive(s)], "py-spy outlived attach"
    assert "Traceback" not in err, err
    left = sorted(p.name for p in tmp.glob("starvecheck-*"))
    if signum == signal.SIGKILL:
        assert left, "SIGKILL cannot be caught: the scratch directory stays"
        r = run("clean", str(tmp), env={"TMPDIR": str(tmp)})
        assert r.exit_code == 0 and "removed" in r.stdout, r.stdout
    assert list(tmp.iterdir()) == [], (signum, left)
    # The job runs on, and nothing is left attached to it.
    assert loop.poll() is None
    with open(f"/proc/{loop.pid}/status") as f:
        assert "TracerPid:\t0" in f.read()
