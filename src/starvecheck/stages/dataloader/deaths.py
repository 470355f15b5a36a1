"""How a DataLoader worker died, and the processes a pipeline left running.

A worker the kernel killed for memory (the cgroup's limit, or the machine's) reaches
the main process as "DataLoader worker (pid N) is killed by signal: Killed", "exited
unexpectedly", or a ConnectionResetError from the hand-over it was in: never as
memory. The OOM killer counts its kills (probe/cgroup.py, `oom_kills`): read as a
configuration starts (`watch`) and again at a worker's death, a rise names the cause
with the count as evidence (`named`).

A user's dataset may start processes of its own (a decoder, a helper server) that
outlive the worker that started it; orphaned, they went to init and ran on after the
run. This process is made their subreaper (PR_SET_CHILD_SUBREAPER, Linux), so they
come back to it as children; `Strays` stops those started since a point, and says so.
multiprocessing's own (the resource tracker, the fork server, a Process the user's
code keeps, such as a Manager) are left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Callable

from starvecheck.core import clocks
from starvecheck.probe.cgroup import oom_kills
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.dataloader.workers import prctl, running

# --- a worker killed for memory ---------------------------------------------------------------

# The ways torch reports a worker that died under it.
_DEATH = re.compile(
    r"exited unexpectedly|killed by signal|ConnectionResetError|ConnectionRefusedError"
    r"|EOFError|BrokenPipeError"
)
_baseline: list[tuple[int, str] | None] = [None]


def watch() -> None:
    """Before a configuration's workers start: the OOM kills counted so far."""
    _baseline[0] = oom_kills(SysRoot.from_environ())


def named(text: str) -> str:
    """`text`, the line of a worker's death, with its cause where it can be named: the
    OOM killer where its count rose since `watch`; SIGBUS, which a full /dev/shm
    gives."""
    if not _DEATH.search(text):
        return text
    before = _baseline[0]
    now = oom_kills(SysRoot.from_environ()) if before is not None else None
    if before is not None and now is not None and now[0] > before[0]:
        return (
            f"a DataLoader worker was killed for memory (the kernel's OOM killer: oom_kill in "
            f"{now[1]} rose from {before[0]} to {now[0]} while this configuration ran); fewer "
            f"workers, or less memory per worker, fit the limit ({text})"
        )
    if "Bus error" in text:
        return (
            f"{text} (SIGBUS: /dev/shm is full as a rule; give the container a larger "
            "/dev/shm, docker --shm-size)"
        )
    return text


# --- processes left running ---------------------------------------------------------------

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_subreaper: list[bool] = []


def adopt_orphans() -> None:
    """Make this process the subreaper of everything it starts (once): a process whose
    parent (a worker) exits comes back to this one instead of init."""
    if _subreaper:
        return
    _subreaper.append(True)
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError),
                open(f"/proc/{pid}/task/{task}/children") as f,
            ):
                found |= {int(x) for x in f.read().split()}
    return found


def _kept() -> set[int]:
    """multiprocessing's own children: the resource tracker, the fork server, and every
    Process still tracked (a Manager the user's code started)."""
    import multiprocessing
    from multiprocessing import forkserver, resource_tracker

    pids = {p.pid for p in multiprocessing.active_children() if p.pid is not None}
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    server = getattr(forkserver, "_forkserver", None)
    for pid in (getattr(tracker, "_pid", None), getattr(server, "_forkserver_pid", None)):
        if pid is not None:
            pids.add(pid)
    return pids


class Strays:
    """This process's children at a point (`mark`); `stop` kills those started since
    (or since the children `now` gave), with their own children, and reaps them; `say`
    warns once of all it stopped."""

    def __init__(self) -> None:
        self.before: set[int] = set()
        self.stopped: set[int] = set()

    def mark(self) -> None:
        adopt_orphans()
        self.before = self.now()

    def now(self) -> set[int]:
        return _children(os.getpid())

    def stop(self, since: set[int] | None = None) -> None:
        new = self.now() - (self.before if since is None else since) - _kept()
        if not new:
            return
        tree = set(new)
        todo = list(new)
        while todo:
            for child in _children(todo.pop()) - tree:
                tree.add(child)
                todo.append(child)
        alive = {pid for pid in tree if running(pid)}
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.stopped |= alive
        deadline = clocks.monotonic() + 2.0
        waiting = set(new)
        while waiting and clocks.monotonic() < deadline:
            for pid in list(waiting):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid  # reaped elsewhere
                if done:
                    waiting.discard(pid)
            if waiting:
                clocks.sleep(0.01)

    def say(self, warn: Callable[[str], None]) -> None:
        if not self.stopped:
            return
        n = len(self.stopped)
        shown = ", ".join(map(str, sorted(self.stopped)[:8])) + (", ..." if n > 8 else "")
        warn(
            f"the pipeline left {n} process(es) of its own running (pid {shown}), started "
            "by its dataset or its workers: stopped"
        )
