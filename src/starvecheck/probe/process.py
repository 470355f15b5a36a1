"""Facts about one process (or thread) from /proc, read through the fake-machine root
(probe/sysroot.py), for `attach` and whatever else reads a process it does not own.

Parsers are pure functions of text; readers return a value or None (gone, or not
ours to read), never raise. Everything read comes from a process starvecheck does not
own, so every read is bounded (SysRoot's cap) and every field checked.

Ids: /proc shows a process under the ids of the PID namespace its mount belongs to;
`NSpid:` in /proc/PID/status lists the process's ids from that namespace inwards (the
last is the id the process sees itself as). py-spy names threads by that innermost id
(a job that is PID 1 of a container shows as "thread (1)" from the node), so
`thread_ids` maps those back to ours.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from starvecheck.probe.sysroot import SysRoot
from starvecheck.probe.text import is_uint

TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
CAP_SYS_PTRACE = 19
MAX_VALUE = 4096  # characters kept of an environment variable (8 GPU UUIDs fit)
MAX_TASKS = 20_000  # threads read of one process; a torch job has hundreds
MAX_GROUPS = 65_536  # the kernel's NGROUPS_MAX
# A stat line is some 52 numbers after the name (at most 64 bytes): a few hundred bytes.
STAT_MAX_BYTES = 4096


@dataclass(frozen=True)
class Stat:
    """/proc/PID/stat: state letter, parent, user + system CPU seconds, and its start
    time (clock ticks after boot: another process under a reused PID has another)."""

    state: str
    ppid: int
    cpu_s: float
    start: int | None = None


def parse_stat(text: str) -> Stat | None:
    """/proc/PID/stat, the one parser of it. The name (field 2) may hold spaces,
    parentheses, newlines and bytes that are not UTF-8 (a process names itself: prctl
    PR_SET_NAME, or the executable's name): fields are counted after the last ')', which
    the numbers after it never hold."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 13:
        return None
    state, ppid, utime, stime = fields[0], fields[1], fields[11], fields[12]
    if len(state) != 1 or not (is_uint(ppid) and is_uint(utime) and is_uint(stime)):
        return None
    start = int(fields[19]) if len(fields) > 19 and is_uint(fields[19]) else None
    return Stat(state, int(ppid), (int(utime) + int(stime)) * TICK_S, start)


@dataclass(frozen=True)
class Status:
    """The lines of /proc/PID/status attach needs; None where a line is missing."""

    name: str | None = None
    state: str | None = None  # the letter: R, S, D, T, t, Z, X, I
    ppid: int | None = None
    threads: int | None = None
    uid: int | None = None  # real
    euid: int | None = None
    fsuid: int | None = None  # the uid the kernel checks file access against
    gid: int | None = None  # real
    egid: int | None = None
    fsgid: int | None = None
    groups: tuple[int, ...] | None = None  # supplementary; None where the line is missing
    nspid: tuple[int, ...] = ()  # outermost (this /proc's namespace) to innermost
    cap_eff: int | None = None
    tracer: int | None = None

    @property
    def inner_pid(self) -> int | None:
        """The id the process has in its own PID namespace (itself where not nested)."""
        return self.nspid[-1] if self.nspid else None


def _ints(text: str) -> list[int] | None:
    parts = text.split()
    return [int(p) for p in parts] if parts and all(is_uint(p) for p in parts) else None


def _hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def parse_status(text: str) -> Status:
    fields: dict[str, object] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if not colon:
            continue
        value = value.strip()
        if key == "Name":
            fields["name"] = value[:64]
        elif key == "State" and value[:1].isalpha():
            fields["state"] = value[:1]
        elif key in ("PPid", "Threads", "TracerPid") and is_uint(value):
            fields[{"PPid": "ppid", "Threads": "threads", "TracerPid": "tracer"}[key]] = int(value)
        elif key == "Uid" and (ids := _ints(value)) and len(ids) >= 2:
            fields["uid"], fields["euid"] = ids[0], ids[1]
            fields["fsuid"] = ids[3] if len(ids) == 4 else None
        elif key == "Gid" and (ids := _ints(value)) and len(ids) == 4:
            fields["gid"], fields["egid"], fields["fsgid"] = ids[0], ids[1], ids[3]
        elif key == "Groups":
            groups = _ints(value) if value else []
            fine = groups is not None and len(groups) <= MAX_GROUPS
            fields["groups"] = tuple(groups) if fine and groups is not None else None
        elif key == "NSpid" and (ids := _ints(value)):
            fields["nspid"] = tuple(ids[:32])
        elif key == "CapEff" and value and len(value) <= 32 and _hex(value):
            fields["cap_eff"] = int(value, 16)
    return Status(**fields)  # type: ignore[arg-type]


def parse_cmdline(text: str) -> list[str]:
    """argv: NUL-separated words (a process may rewrite it: any text is taken)."""
    return [w for w in text.split("\0") if w]


def parse_environ(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split("\0"):
        key, eq, value = item.partition("=")
        if eq and key:
            out[key] = value[:MAX_VALUE]
    return out


def parse_uss(text: str) -> int | None:
    """Private_Clean + Private_Dirty of smaps_rollup (kB): what the process alone
    holds; None where neither line is there."""
    total, seen = 0, False
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty"):
            parts = rest.split()
            if parts and is_uint(parts[0]):
                total += int(parts[0]) * 1024
                seen = True
    return total if seen else None


def parse_io(text: str) -> dict[str, int]:
    """/proc/PID/io: "key: value" lines (read_bytes, write_bytes, rchar ...)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and is_uint(value.strip()):
            out[key.strip()] = int(value.strip())
    return out


def shorten(words: list[str], limit: int = 160) -> str:
    """argv joined for a one-line message: unprintable characters replaced, bounded."""
    text = " ".join(words)
    safe = "".join(c if c.isprintable() else "?" for c in text)
    return safe[:limit] + ("..." if len(safe) > limit else "")


# Readers: through SysRoot, None where the file cannot be read.


def _text(root: SysRoot, path: str) -> str | None:
    return root.read(path).value


def _base(pid: int | str, tid: int | None = None) -> str:
    return f"/proc/{pid}" + (f"/task/{tid}" if tid is not None else "")


def stat(root: SysRoot, pid: int | str, tid: int | None = None) -> Stat | None:
    text = _text(root, _base(pid, tid) + "/stat")
    return parse_stat(text) if text else None


def own_stat(pid: int | str = "self") -> Stat | None:
    """This machine's /proc/PID/stat, read directly rather than through the fake-machine
    root: for the processes starvecheck itself runs (this one's start time, a worker's
    parent, the creator a scratch marker names), which live here whatever
    STARVECHECK_SYSROOT points at. None where the process is gone or the file cannot be
    read or parsed; never raises. `pid`: a number, or "self"."""
    if not (pid == "self" or (type(pid) is int and pid > 0) or (type(pid) is str and is_uint(pid))):
        return None
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            data = os.read(fd, STAT_MAX_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return None
    return parse_stat(data.decode("utf-8", errors="replace"))


def status(root: SysRoot, pid: int | str, tid: int | None = None) -> Status | None:
    text = _text(root, _base(pid, tid) + "/status")
    return parse_status(text) if text else None


def cmdline(root: SysRoot, pid: int) -> list[str] | None:
    text = _text(root, f"/proc/{pid}/cmdline")
    return None if text is None else parse_cmdline(text)


def comm(root: SysRoot, pid: int) -> str:
    return (_text(root, f"/proc/{pid}/comm") or "?").strip()[:64]


def command(root: SysRoot, pid: int) -> str | None:
    """argv joined and shortened ("[name]" for a kernel thread or an emptied argv);
    None where the process is not there."""
    words = cmdline(root, pid)
    if words is None:
        return None
    return shorten(words) if words else f"[{shorten([comm(root, pid)])}]"


def environ(root: SysRoot, pid: int) -> dict[str, str] | None:
    text = _text(root, f"/proc/{pid}/environ")
    return None if text is None else parse_environ(text)


def uss(root: SysRoot, pid: int) -> int | None:
    text = _text(root, f"/proc/{pid}/smaps_rollup")
    return parse_uss(text) if text else None


def io(root: SysRoot, pid: int) -> dict[str, int] | None:
    text = _text(root, f"/proc/{pid}/io")
    return None if text is None else parse_io(text)


def cwd(root: SysRoot, pid: int) -> str | None:
    return root.readlink(f"/proc/{pid}/cwd").value


def maps_hold(root: SysRoot, pid: int, *names: str) -> bool | None:
    """Whether the process has mapped a file whose path holds one of `names`; None
    where its maps cannot be read (another user's process)."""
    text = _text(root, f"/proc/{pid}/maps")
    if text is None:
        return None
    return any(n in text for n in names)


def pids(root: SysRoot) -> list[int]:
    return [int(n) for n in root.listdir("/proc") if is_uint(n)]


def tids(root: SysRoot, pid: int) -> list[int]:
    return [int(n) for n in root.listdir(f"/proc/{pid}/task")[:MAX_TASKS] if is_uint(n)]


def parents(root: SysRoot) -> dict[int, int]:
    """Every process -> its parent, from one pass over /proc/*/stat."""
    out: dict[int, int] = {}
    for pid in pids(root):
        s = stat(root, pid)
        if s is not None:
            out[pid] = s.ppid
    return out


def descendants(parent_of: dict[int, int], of: list[int]) -> dict[int, list[int]]:
    """Each of `of` -> its descendants (children, their children), from a parent map."""
    kids: dict[int, list[int]] = {}
    for pid, parent in parent_of.items():
        kids.setdefault(parent, []).append(pid)
    out: dict[int, list[int]] = {}
    for pid in of:
        found, todo, seen = [], [pid], {pid}
        while todo:
            these = sorted(k for k in kids.get(todo.pop(), ()) if k not in seen)
            seen.update(these)
            found += these
            todo += these
        out[pid] = found
    return out


def ancestors(parent_of: dict[int, int], pid: int) -> list[int]:
    """`pid`'s parent, its parent ... (nearest first; bounded, loops cut)."""
    out: list[int] = []
    p = parent_of.get(pid, 0)
    while p > 0 and p not in out and p != pid and len(out) < 256:
        out.append(p)
        p = parent_of.get(p, 0)
    return out


def outermost(candidates: set[int], parent_of: dict[int, int]) -> set[int]:
    """Those of `candidates` with no ancestor among them: the ranks, where the
    candidates are processes carrying RANK (a rank's DataLoader workers inherit it)."""
    return {p for p in candidates if not candidates.intersection(ancestors(parent_of, p))}


def id_map(inner_to_ours: dict[int, int], key: tuple[int, int]) -> tuple[int, int]:
    """A (process, thread) key whose thread id is the innermost namespace's, in ours."""
    pid, tid = key
    return pid, inner_to_ours.get(tid, tid)


def thread_ids(root: SysRoot, pid: int) -> dict[int, int]:
    """The process's threads: innermost id (what py-spy names them by) -> our id.
    Only those that differ; empty where the process shares our PID namespace or is
    gone."""
    own = status(root, pid)
    if own is None or len(own.nspid) < 2:
        return {}  # in our namespace (or gone): its threads' ids are ours
    out: dict[int, int] = {}
    for tid in tids(root, pid):
        s = status(root, pid, tid)
        inner = s.inner_pid if s is not None else None
        if inner is not None and inner != tid:
            out[inner] = tid
    return out


# Reading another process's memory (py-spy): what the kernel may refuse, and why.


@dataclass(frozen=True)
class PtraceFacts:
    scope: int | None  # kernel.yama.ptrace_scope; None where Yama is not built in
    our_uid: int | None
    job_uid: int | None
    have_cap: bool | None  # CAP_SYS_PTRACE in our effective set


def parse_scope(text: str) -> int | None:
    value = text.strip()
    return int(value) if is_uint(value) and len(value) < 3 else None


def ptrace_facts(root: SysRoot, pid: int) -> PtraceFacts:
    scope_text = _text(root, "/proc/sys/kernel/yama/ptrace_scope")
    me, job = status(root, "self"), status(root, pid)
    cap = me.cap_eff if me is not None else None
    return PtraceFacts(
        parse_scope(scope_text) if scope_text else None,
        me.euid if me is not None else None,
        job.uid if job is not None else None,
        None if cap is None else bool(cap >> CAP_SYS_PTRACE & 1),
    )


def _scope_0(facts: PtraceFacts) -> str:
    """Yama at 1 or 2 refuses even the same user: what it must be set to as well."""
    return " with kernel.yama.ptrace_scope 0" if facts.scope in (1, 2) else ""


def ptrace_allowed(facts: PtraceFacts) -> bool | None:
    """Whether the kernel lets this process read the job's memory, by the rules
    ptrace_missing names; None where the facts do not tell."""
    if facts.scope == 3:
        return False
    if facts.have_cap:
        return True
    if facts.have_cap is None:
        return None
    if facts.job_uid is not None and facts.our_uid is not None and facts.job_uid != facts.our_uid:
        return False
    if facts.scope in (1, 2):
        return False  # scope 1: only a process's ancestors (attach is not one)
    return True if facts.scope in (0, None) and facts.job_uid is not None else None


GRANT = (
    'Kubernetes: securityContext.capabilities.add: ["SYS_PTRACE"]; '
    "docker: docker run --cap-add SYS_PTRACE; or run attach as root on the node"
)


def ptrace_missing(facts: PtraceFacts, pid: int) -> str:
    """What stops this process from reading `pid`'s memory, and the exact grant, in
    one sentence (the kernel's rules: Yama's ptrace_scope, then the uids, then
    CAP_SYS_PTRACE)."""
    if facts.scope == 3:
        return (
            "kernel.yama.ptrace_scope is 3 on this machine: no process may read another's "
            "memory until the machine is rebooted with it at 0, 1 or 2"
        )
    if facts.have_cap:
        return (
            "reading its memory was refused though attach holds CAP_SYS_PTRACE: a seccomp "
            "profile may block process_vm_readv (docker adds it with --cap-add SYS_PTRACE; "
            'Kubernetes with securityContext.capabilities.add: ["SYS_PTRACE"])'
        )
    lacking = "attach lacks CAP_SYS_PTRACE"
    if facts.job_uid is not None and facts.our_uid is not None and facts.job_uid != facts.our_uid:
        return (
            f"PID {pid} runs as uid {facts.job_uid} and attach as uid {facts.our_uid}, and "
            f"{lacking}: run attach as uid {facts.job_uid}{_scope_0(facts)} or grant "
            f"SYS_PTRACE ({GRANT})"
        )
    if facts.scope == 2:
        return (
            "kernel.yama.ptrace_scope is 2 (only CAP_SYS_PTRACE may read another process's "
            f"memory) and {lacking}: grant SYS_PTRACE ({GRANT})"
        )
    if facts.scope == 1:
        return (
            f"kernel.yama.ptrace_scope is 1 (a process may read only its own descendants) "
            f"and {lacking}: grant SYS_PTRACE ({GRANT}), or set sysctl "
            "kernel.yama.ptrace_scope=0 on the node"
        )
    return f"{lacking}: grant SYS_PTRACE ({GRANT})"
