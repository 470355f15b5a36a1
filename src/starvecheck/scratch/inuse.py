"""Whether a live process still uses something `starvecheck clean` would remove: a
file it has open or mapped (a write lease, else /proc/PID/maps), a Unix socket it
listens on (/proc/net/unix).

A dead run's marker proves who made a name, not that nobody uses it now: a forged or
stale marker can name a block a training job has mapped. The kernel answers first: it
grants a write lease on a file (fcntl F_SETLEASE) only when no other open file refers
to it, in any process of any user or namespace, and a mapping keeps its file open
after the descriptor is closed. So a file clean may take a lease on is used by nobody,
and clean unlinks it while holding the lease (an open that races it waits for the
release). Where leases are not available (fs.leases-enable=0), every process's
/proc/PID/maps is read instead, and a process whose maps cannot be read (another
user's, a non-dumpable one such as sshd's session process, one with more capabilities
than the caller) counts as mapping every file it could have opened: one of its uids
owns the file, or the file's mode lets others open it. (Root can open anything; a root
process is not counted against a file private to another user, mode 0600, as
Streaming's blocks are.)

The parsers are pure functions of text (tests feed them text); nothing here raises.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat
from collections.abc import Iterator

from starvecheck.core.units import parse_uint

PROC = "/proc"
# F_SETLEASE and F_UNLCK where this platform's fcntl module has them (Linux).
_SETLEASE = getattr(fcntl, "F_SETLEASE", None)


def lease(fd: int) -> bool | None:
    """Take a write lease on the open file `fd` (opened read-only by this process):
    True when taken (no other open file, descriptor or mapping, of any process refers to
    the file; `unlease` gives it back), False when refused because one does, None where
    leases are not available here. Call inside `quiet_lease_breaks`."""
    if _SETLEASE is None:
        return None
    try:
        fcntl.fcntl(fd, _SETLEASE, fcntl.F_WRLCK)
    except OSError as e:
        return False if e.errno in (errno.EAGAIN, errno.EBUSY) else None
    return True


def unlease(fd: int) -> None:
    if _SETLEASE is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _SETLEASE, fcntl.F_UNLCK)


@contextlib.contextmanager
def quiet_lease_breaks() -> Iterator[bool]:
    """A process that opens a leased file makes the kernel send the holder SIGIO, whose
    default action ends it: ignored while leases are held. Yields whether leases may be
    taken (signal dispositions can be changed in the main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    old = signal.signal(signal.SIGIO, signal.SIG_IGN)
    try:
        yield True
    finally:
        signal.signal(signal.SIGIO, old)


def maps_paths(text: str) -> set[str]:
    """The files a /proc/PID/maps text maps (its sixth field, where there is one)."""
    paths = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            paths.add(parts[5])
    return paths


def status_uids(text: str) -> set[int]:
    """Real, effective, saved and filesystem uids from a /proc/PID/status text."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            try:
                return {int(x) for x in line.split()[1:]}
            except ValueError:
                return set()
    return set()


def status_name(text: str) -> str:
    """The command name from a /proc/PID/status text ("" where there is none)."""
    for line in text.splitlines():
        if line.startswith("Name:"):
            return line[5:].strip()
    return ""


def unix_socket_paths(text: str) -> set[str]:
    """The filesystem paths Unix sockets are bound to, from a /proc/net/unix text
    (abstract names, which start with @, are not paths)."""
    paths = set()
    for line in text.splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) == 8 and parts[7].startswith("/"):
            paths.add(parts[7])
    return paths


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return os.fsdecode(f.read())


def _could_map(st: os.stat_result, uids: set[int]) -> bool:
    """Whether a process with `uids` (empty: unknown) could have opened the file."""
    if not uids:
        return True
    return st.st_uid in uids or bool(st.st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def mapped(files: dict[str, os.stat_result], proc: str | None = None) -> dict[str, str]:
    """For each path of `files` (with its lstat) that a process maps, or may map where
    its maps cannot be read, why it is in use. Paths not in the answer are mapped by
    no process. `proc`: where /proc is (PROC, read at the call: tests move it)."""
    if not files:
        return {}
    proc = PROC if proc is None else proc
    try:
        pids = sorted((p for p in os.listdir(proc) if parse_uint(p) is not None), key=int)
    except OSError as e:
        return {path: f"cannot list processes ({proc}: {e.strerror})" for path in files}
    found: dict[str, str] = {}
    for pid in pids:
        try:
            text = _read(os.path.join(proc, pid, "maps"))
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone since the listing
        except OSError:
            _unreadable(files, os.path.join(proc, pid), pid, found)
            continue
        for path in files.keys() & maps_paths(text):
            found[path] = f"in use: mapped by pid {pid}"  # certain: over a "may"
    return found


def _unreadable(
    files: dict[str, os.stat_result], where: str, pid: str, found: dict[str, str]
) -> None:
    """A process whose maps cannot be read (another user's, a non-dumpable one, one with
    more capabilities): each file it could have opened counts as mapped by it."""
    try:
        text = _read(os.path.join(where, "status"))
    except OSError:
        text = ""
    uids, name = status_uids(text), status_name(text)
    for path, st in files.items():
        if path not in found and _could_map(st, uids):
            found[path] = (
                f"pid {pid}{f' ({name})' if name else ''} may map it: its memory maps "
                "cannot be read"
            )


def listening_under(directory: str, proc: str | None = None) -> str | None:
    """Why `directory` is in use, when a live Unix socket is bound inside it (or that
    cannot be told); None when none is."""
    proc = PROC if proc is None else proc
    try:
        paths = unix_socket_paths(_read(os.path.join(proc, "net", "unix")))
    except OSError as e:
        return f"cannot tell whether a process listens in it ({proc}/net/unix: {e.strerror})"
    inside = sorted(p for p in paths if p.startswith(directory.rstrip("/") + "/"))
    return f"in use: a process listens on {inside[0]}" if inside else None
