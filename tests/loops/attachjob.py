"""Helpers for attach's tests on a job's files and on a misbehaving py-spy
(tests/test_attach_source.py, tests/test_attach_spy_bounds.py,
tests/test_hostile4_attach.py): a job with torch loaded, run as any user, whose code
carries any file name; attach run as a process of its own with a fake py-spy
(fake_spy.py) whose every process carries a marker word; the processes left with it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import marked, source_env

HERE = Path(__file__).resolve().parent
NOBODY = 65534
# The job: torch loaded (attach refuses a Python without it), then a loop of its own
# code compiled under FILE's name, whose line 3 it sits on for ever (`time.sleep` is C:
# line 3 is the innermost Python frame every sample names).
JOB = (
    "import sys, time, torch\n"
    "code = 'import time\\n\\nwhile True: time.sleep(0.005)\\n'\n"
    "open(sys.argv[2], 'w').close()\n"
    "exec(compile(code, sys.argv[1], 'exec'))\n"
)
# What attach's classifier would read at line 3 of a file standing in for the job's.
GPU_LINE = "import torch\n\nloss = model(x).item()  # SENTINEL: would make this gpu-wait\n"


def env(**extra: str) -> dict[str, str]:
    return source_env(**{"NO_COLOR": "1", **extra})


def can_switch_user() -> str | None:
    """None where this test may run a process as nobody; else why not."""
    if os.geteuid() != 0:
        return "needs root (a job as another user)"
    if shutil.which("setpriv") is None:
        return "setpriv is not installed"
    r = subprocess.run(as_user(NOBODY, [sys.executable, "-c", "import torch"]),
                       capture_output=True, text=True, timeout=120, cwd="/")  # fmt: skip
    return None if r.returncode == 0 else f"nobody cannot run this Python: {r.stderr[-200:]}"


def as_user(uid: int, cmd: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory every user may write (tmp_path's parents are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="starvecheck-src-"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def job(code_file: str, where: Path, uid: int | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """The job (JOB above) with its code named `code_file`, running in `where`."""
    ready = where / f"ready-{secrets.token_hex(3)}"
    cmd = [sys.executable, "-c", JOB, code_file, str(ready)]
    p = subprocess.Popen(as_user(uid, cmd) if uid is not None else cmd, cwd=where,
                         start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not ready.exists():
            assert p.poll() is None, "the job exited"
            assert time.time() < deadline, "the job never started"
            time.sleep(0.1)
        yield p
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, 9)
        p.wait()


@dataclass
class FakeSpy:
    path: Path
    marker: str


def fake_spy(where: Path, behaviour: str) -> FakeSpy:
    marker = f"fakespy{secrets.token_hex(6)}"
    path = where / f"py-spy-{behaviour}"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "fake_spy.py"} {behaviour} '
                    f'{marker} "$@"\n')  # fmt: skip
    path.chmod(0o755)
    return FakeSpy(path, marker)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    took_s: float

    def stage(self) -> dict[str, Any]:
        return json.loads(self.stdout)["stages"][0]

    def shares(self) -> dict[str, float]:
        return {m["labels"]["kind"]: m["value"] for m in self.stage()["metrics"]
                if m["labels"].get("quantity") == "main_share"}  # fmt: skip

    def caveats(self, id_prefix: str = "") -> list[str]:
        return [c for c in self.stage()["caveats"] if c.startswith(id_prefix)]


def attach(pid: int, spy: FakeSpy, *extra: str, timeout: float = 120, **kw: str) -> Run:
    cmd = [sys.executable, str(HERE / "attach_with_spy.py"), str(spy.path), "attach", str(pid),
           "--json", "-", *extra]  # fmt: skip
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**kw))
    return Run(r.returncode, r.stdout, r.stderr, time.monotonic() - t0)


def none_left(marker: str, within_s: float = 5.0) -> list[int]:
    """The marked processes still running `within_s` seconds on (a deadline, not a
    figure asserted): [] where none is."""
    deadline = time.time() + within_s
    while (left := marked(marker)) and time.time() < deadline:
        time.sleep(0.05)
    for pid in left:  # never leave them to the rest of the run
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    return left


def stacks_file(where: Path, *frames: str, n: int = 100) -> Path:
    """py-spy's raw output: the job's main thread ({pid}) on `frames`, n samples."""
    path = where / f"stacks-{secrets.token_hex(3)}.txt"
    path.write_text('process {pid}:"python job";thread ({pid}): MainThread;'
                    + ";".join(frames) + f" {n}\n")  # fmt: skip
    return path
