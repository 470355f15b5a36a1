"""The job `attach PID` diagnoses, found from /proc (through probe/process.py, so a
fake machine can stand in) without touching it: the process,
whether it is Python with torch loaded (else one line, exit 2), its children (the
DataLoader workers among them, confirmed later by their stacks: `_worker_loop`), and,
where PID is a torchrun agent or `--all` is given, every rank on this node: a process
carrying RANK that is not a descendant of another (a rank's DataLoader workers inherit
RANK with the rest of its environment). PID 1 is read like any other process: in a
container (`docker run img python train.py`, a pod) it is the training process.

Everything read here comes from processes starvecheck does not own: each file is read
bounded, and a process that exits meanwhile is skipped, never an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from starvecheck.core.status import UsageError
from starvecheck.core.units import parse_uint
from starvecheck.probe import process
from starvecheck.probe.sysroot import SysRoot

MAX_RANKS = 64
INITS = {"init", "systemd", "tini", "docker-init", "dumb-init", "catatonit", "s6-svscan",
         "runit", "supervisord", "pause"}  # fmt: skip
SHELLS = {"sh", "bash", "dash", "zsh", "ash", "ksh", "busybox"}


@dataclass(frozen=True)
class Process:
    pid: int
    command: str  # argv joined, shortened
    rank: int | None = None  # RANK from its environment, where it has one
    ns_pid: int | None = None  # its id in its own PID namespace, where not ours

    def describe(self) -> str:
        where = f"rank {self.rank}, " if self.rank is not None else ""
        return f"PID {self.pid} ({where}{self.command})"


@dataclass(frozen=True)
class Job:
    ranks: tuple[Process, ...]  # the training processes sampled (one without torchrun)
    agent: Process | None  # the torchrun agent, where PID was one
    children: dict[int, tuple[int, ...]]  # each rank's child processes when found


def _root(root: SysRoot | None) -> SysRoot:
    return root or SysRoot.from_environ()


def command_of(pid: int, root: SysRoot | None = None) -> str | None:
    return process.command(_root(root), pid)


def descendants_of(pids: list[int], root: SysRoot | None = None) -> dict[int, list[int]]:
    """Each of `pids` -> its descendants, from one reading of /proc/*/stat."""
    return process.descendants(process.parents(_root(root)), pids)


def _is_agent(command: str) -> bool:
    """torchrun (`torchrun ...`, `python -m torch.distributed.run ...`): its argv."""
    words = command.split(" ")[:3]
    return any(w.endswith("torchrun") or w == "torch.distributed.run" for w in words)


def _rank(root: SysRoot, pid: int) -> int | None:
    return parse_uint((process.environ(root, pid) or {}).get("RANK", ""))


def _torch(root: SysRoot, pid: int) -> bool | None:
    return process.maps_hold(root, pid, "libtorch", "torch/lib/")


def _python(root: SysRoot, pid: int, command: str) -> bool:
    found = process.maps_hold(root, pid, "libpython", "/python3")
    return bool(found) or "python" in os.path.basename(command.split(" ")[0])


def _process(root: SysRoot, pid: int, rank: int | None = None) -> Process:
    s = process.status(root, pid)
    inner = s.inner_pid if s is not None else None
    return Process(pid, command_of(pid, root) or "?", rank, inner if inner != pid else None)


def ranks_of(candidates: dict[int, int], parent_of: dict[int, int]) -> dict[int, int]:
    """Of the processes carrying RANK (pid -> rank), the ranks: those that are not a
    descendant of another (a rank's DataLoader workers inherit its environment)."""
    keep = process.outermost(set(candidates), parent_of)
    return {pid: rank for pid, rank in candidates.items() if pid in keep}


def find(pid: int, all_ranks: bool = False, root: SysRoot | None = None) -> Job:
    """The job at `pid` (see the module docstring). UsageError, one line, where it is
    not there, is starvecheck itself, is not Python, or has not loaded torch. PID 1
    is read like any other: in a container it is the training process."""
    root = _root(root)
    if pid < 1:
        raise UsageError(f"PID {pid} is not a process id")
    command = command_of(pid, root)
    if command is None:
        raise UsageError(f"no process {pid} (nothing at /proc/{pid})")
    parent_of = process.parents(root)
    # PID 1 is an ancestor of every process: whatever it is, it is said below
    mine = {a for a in process.ancestors(parent_of, os.getpid()) if a != 1}
    if pid == os.getpid() or pid in mine:
        raise UsageError(f"PID {pid} is starvecheck itself or its shell: give the training job's")
    if _is_agent(command):
        return _agent(root, pid, command, parent_of)
    if not _python(root, pid, command):
        raise UsageError(_not_python(root, pid, command, parent_of))
    if _torch(root, pid) is False:
        raise UsageError(
            f"PID {pid} ({command}) has not loaded torch: not a training loop attach can read"
        )
    me = _process(root, pid, _rank(root, pid))
    above = _rank_above(root, pid, parent_of) if me.rank is not None else None
    if above is not None and not all_ranks:
        raise UsageError(
            f"PID {pid} is a worker of rank {above[1]} (PID {above[0]}): attach {above[0]}"
        )
    if above is not None:
        me = _process(root, above[0], above[1])
    if not all_ranks or me.rank is None:
        return _job([me], None, parent_of)
    parent = parent_of.get(me.pid, 0)
    siblings = [p for p, up in parent_of.items() if up == parent and parent > 0]
    found = {s: r for s in siblings if (r := _rank(root, s)) is not None}
    ranks = [_process(root, p, r) for p, r in ranks_of(found, parent_of).items()]
    return _job(sorted(ranks, key=lambda r: r.rank or 0)[:MAX_RANKS], None, parent_of)


def _agent(root: SysRoot, pid: int, command: str, parent_of: dict[int, int]) -> Job:
    kids = process.descendants(parent_of, [pid])[pid]
    found = {k: r for k in kids if (r := _rank(root, k)) is not None}
    ranks = [_process(root, p, r) for p, r in ranks_of(found, parent_of).items()]
    ranks = [r for r in ranks if _torch(root, r.pid) is not False]
    if not ranks:
        raise UsageError(f"PID {pid} ({command}) is a torchrun agent with no rank running")
    ranks = sorted(ranks, key=lambda r: r.rank or 0)[:MAX_RANKS]
    return _job(ranks, Process(pid, command), parent_of)


def _rank_above(root: SysRoot, pid: int, parent_of: dict[int, int]) -> tuple[int, int] | None:
    """The outermost ancestor of `pid` carrying RANK (the rank `pid` is a worker of)."""
    above = None
    for p in process.ancestors(parent_of, pid):
        rank = _rank(root, p)
        if rank is not None:
            above = (p, rank)
    return above


def _not_python(root: SysRoot, pid: int, command: str, parent_of: dict[int, int]) -> str:
    """One line: what `pid` is (PID 1: an init or a shell, as in a container whose
    entry point starts the job), and the Python processes with torch under it."""
    name = os.path.basename(command.strip("[]").split(" ")[0])
    if name in SHELLS:
        line = f"PID {pid} ({command}) is a shell, not a training process"
    elif name in INITS:
        line = f"PID {pid} ({command}) is an init process, not a training process"
    else:
        line = f"PID {pid} ({command}) is not a Python process"
    under, tried = [], 0
    for k in process.descendants(parent_of, [pid])[pid]:
        k_command = command_of(k, root) or ""
        if "python" not in k_command.split(" ")[0] or tried >= 20:
            continue
        tried += 1
        if _torch(root, k):
            under.append(f"PID {k} ({k_command[:60]})")
        if len(under) == 3:
            break
    return line + (f"; with torch under it: {', '.join(under)}" if under else "")


def _job(ranks: list[Process], agent: Process | None, parent_of: dict[int, int]) -> Job:
    found = process.descendants(parent_of, [r.pid for r in ranks])
    return Job(tuple(ranks), agent, {pid: tuple(kids) for pid, kids in found.items()})
