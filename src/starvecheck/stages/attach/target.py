"""The job `attach PID` diagnoses, found from /proc without touching it: the process,
whether it is Python with torch loaded (else one line, exit 2), its children (the
DataLoader workers among them, confirmed later by their stacks: `_worker_loop`), and,
where PID is a torchrun agent or `--all` is given, every rank on this node.

Everything read here comes from processes starvecheck does not own: each file is read
bounded, and a process that exits meanwhile is skipped, never an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from starvecheck.core.status import UsageError

MAX_READ = 1 << 20  # bytes read of any /proc file
MAX_RANKS = 64


@dataclass(frozen=True)
class Process:
    pid: int
    command: str  # argv joined, shortened
    rank: int | None = None  # RANK from its environment, where it has one

    def describe(self) -> str:
        where = f"rank {self.rank}, " if self.rank is not None else ""
        return f"PID {self.pid} ({where}{self.command})"


@dataclass(frozen=True)
class Job:
    ranks: tuple[Process, ...]  # the training processes sampled (one without torchrun)
    agent: Process | None  # the torchrun agent, where PID was one
    children: dict[int, tuple[int, ...]]  # each rank's child processes when found


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ)
    except OSError:
        return None


def command_of(pid: int) -> str | None:
    raw = _read(f"/proc/{pid}/cmdline")
    if raw is None:
        return None
    words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    text = " ".join(words) or f"[{_comm(pid)}]"
    safe = "".join(c if c.isprintable() else "?" for c in text)
    return safe[:160] + ("..." if len(safe) > 160 else "")


def _comm(pid: int) -> str:
    raw = _read(f"/proc/{pid}/comm") or b"?"
    return raw.decode(errors="replace").strip()


def environ_of(pid: int) -> dict[str, str] | None:
    raw = _read(f"/proc/{pid}/environ")
    if raw is None:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, eq, val = item.partition(b"=")
        if eq:
            out[key.decode(errors="replace")] = val.decode(errors="replace")[:200]
    return out


def children_of(pid: int) -> list[int]:
    """Every descendant of `pid` (children, their children), from /proc/*/stat."""
    return descendants_of([pid])[pid]


def descendants_of(pids: list[int]) -> dict[int, list[int]]:
    """Each of `pids` -> its descendants, from one reading of /proc/*/stat."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        parent = _parent(int(name)) if name.isdigit() else None
        if parent is not None:
            kids.setdefault(parent, []).append(int(name))
    out: dict[int, list[int]] = {}
    for pid in pids:
        found, todo = [], [pid]
        while todo:
            these = sorted(kids.get(todo.pop(), ()))
            found += these
            todo += these
        out[pid] = found
    return out


def _maps_hold(pid: int, *names: bytes) -> bool | None:
    """Whether the process has mapped a file whose path holds one of `names`; None
    where its maps cannot be read (another user's process)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for _ in range(200_000):
                line = f.readline()
                if not line:
                    return False
                if any(n in line for n in names):
                    return True
    except OSError:
        return None
    return False


def _is_agent(command: str) -> bool:
    """torchrun (`torchrun ...`, `python -m torch.distributed.run ...`): its argv."""
    words = command.split(" ")[:3]
    return any(w.endswith("torchrun") or w == "torch.distributed.run" for w in words)


def _rank(pid: int) -> int | None:
    env = environ_of(pid) or {}
    value = env.get("RANK", "")
    return int(value) if value.isdigit() else None


def find(pid: int, all_ranks: bool = False) -> Job:
    """The job at `pid` (see the module docstring). UsageError, one line, where it is
    not there, is starvecheck itself, is not Python, or has not loaded torch."""
    if pid <= 1:
        raise UsageError(f"PID {pid} is not a training process")
    command = command_of(pid)
    if command is None:
        raise UsageError(f"no process {pid} (nothing at /proc/{pid})")
    if pid == os.getpid() or pid in _ancestors():
        raise UsageError(f"PID {pid} is starvecheck itself or its shell: give the training job's")
    kids = children_of(pid)
    if _is_agent(command):
        ranks = [
            Process(k, command_of(k) or "?", rank) for k in kids if (rank := _rank(k)) is not None
        ]
        ranks = [r for r in ranks if _maps_hold(r.pid, b"libtorch") is not False]
        if not ranks:
            raise UsageError(f"PID {pid} ({command}) is a torchrun agent with no rank running")
        return _job(sorted(ranks, key=lambda r: r.rank or 0)[:MAX_RANKS], Process(pid, command))
    python = _maps_hold(pid, b"libpython", b"/python3") or "python" in command.split(" ")[0]
    if not python:
        raise UsageError(f"PID {pid} ({command}) is not a Python process")
    torch = _maps_hold(pid, b"libtorch", b"torch/lib/")
    if torch is False:
        raise UsageError(
            f"PID {pid} ({command}) has not loaded torch: not a training loop attach can read"
        )
    me = Process(pid, command, _rank(pid))
    if not all_ranks or me.rank is None:
        return _job([me], None)
    parent = _parent(pid)
    siblings = children_of(parent) if parent else []
    ranks = [Process(s, command_of(s) or "?", _rank(s)) for s in siblings]
    ranks = [r for r in ranks if r.rank is not None and _parent(r.pid) == parent]
    return _job(sorted(ranks, key=lambda r: r.rank or 0)[:MAX_RANKS], None)


def _job(ranks: list[Process], agent: Process | None) -> Job:
    found = descendants_of([r.pid for r in ranks])
    return Job(tuple(ranks), agent, {pid: tuple(kids) for pid, kids in found.items()})


def _parent(pid: int) -> int | None:
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    rest = raw.rpartition(b")")[2].split()
    return int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None


def _ancestors() -> set[int]:
    out, p = set(), os.getppid()
    while p and p > 1 and p not in out and len(out) < 64:
        out.add(p)
        p = _parent(p) or 0
    return out
