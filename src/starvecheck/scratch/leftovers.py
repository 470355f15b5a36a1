"""Ownership markers, and what killed runs leave behind.

Every scratch directory starvecheck makes holds a marker, `.starvecheck-owner`, made
first and removed last: one JSON line naming its creator (pid, the process's start
time in clock ticks since boot, the boot id, host, uid), then a line for each thing
made outside the directory that the run must remove (Streaming's shared memory and
lock files by prefix, multiprocessing's /tmp/pymp-* directory).

A run that ends normally, by Ctrl-C, SIGTERM or SIGHUP removes all of it. SIGKILL (an
out-of-memory kill is one) cannot be caught: the directory stays. A later run in the
same PATH reports such leftovers; `starvecheck clean PATH` (scratch/reclaim.py) removes a
directory only when its marker proves it is starvecheck's (a small regular file of
the caller's in a directory of the caller's, a well-formed record) and that its
creator is gone (no process with that pid and start time on this boot).

A marker is written by whoever can write in PATH (a shared scratch or data mount), so
it is untrusted input: it is read by file type first (a directory, FIFO, link or huge
file named like it is "not starvecheck's", never an error), and what it names outside
the directory is removed only where scratch/reclaim.py proves it is starvecheck's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starvecheck.probe.process import own_stat

MARKER = ".starvecheck-owner"
PREFIX = "starvecheck-"
MAX_MARKER_BYTES = 64 << 10  # a marker is a few lines; anything bigger is not ours
# A directory opened to work relative to it, never through a link (scratch/directory.py too).
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A marker is opened without following a link and without blocking (a FIFO).
MARKER_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
NO_MARKER = "no starvecheck marker (made before 0.2, or not ours)"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def start_ticks(pid: int | str = "self") -> int | None:
    """A process's start time, in clock ticks since boot (/proc/PID/stat field 22): with
    the pid, it names one process, even after the pid is reused."""
    # Its name may be anything (not ASCII, parentheses): never a sign the process is gone.
    read = own_stat(pid)
    return read.start if read is not None else None


def boot_id() -> str | None:
    return _read("/proc/sys/kernel/random/boot_id")


def owner_record() -> dict[str, Any]:
    """This process, as a marker's first line records it."""
    return {
        "tool": "starvecheck",
        "pid": os.getpid(),
        "start_ticks": start_ticks(),
        "boot_id": boot_id(),
        "host": socket.gethostname(),
        "uid": os.getuid(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


@dataclass(frozen=True)
class Leftover:
    """A `starvecheck-*` directory in a PATH, and what its marker says."""

    path: str
    owner: dict[str, Any] | None  # None: no marker, or not one starvecheck wrote
    extras: tuple[dict[str, Any], ...] = ()  # things made outside the directory
    why: str = ""  # why it is not removable, where it is not
    kept: bool = False  # left on purpose (--keep), not by a killed run
    ident: tuple[int, int] = (0, 0)  # (st_dev, st_ino) as scanned: removal checks it

    @property
    def removable(self) -> bool:
        return not self.why


def _marker(dir_fd: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str]:
    """The marker's owner record and its other lines, or None and why it is not one.

    By file type first: anything but a small regular file of this user's is not
    starvecheck's, never an error (a directory, a FIFO that would block a read, a link,
    a huge file: anyone who can write in PATH can put one there)."""
    try:
        st = os.stat(MARKER, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None, [], NO_MARKER
    if (why := _not_ours(st)) is not None:
        return None, [], why
    try:  # opened without blocking and without following, then checked again: a swap
        fd = os.open(MARKER, MARKER_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None, [], NO_MARKER
    try:
        st = os.fstat(fd)
        if (why := _not_ours(st)) is not None:
            return None, [], why
        data = b""
        while len(data) <= MAX_MARKER_BYTES and (chunk := os.read(fd, 1 << 16)):
            data += chunk
    except OSError:
        return None, [], NO_MARKER
    finally:
        os.close(fd)
    if len(data) > MAX_MARKER_BYTES:
        return None, [], f"{NO_MARKER}: its {MARKER} is larger than a marker"
    return _records(data)


def _not_ours(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return f"{NO_MARKER}: its {MARKER} is not a regular file"
    if st.st_uid != os.geteuid():
        return f"{NO_MARKER}: its {MARKER} belongs to uid {st.st_uid}, not to you"
    if st.st_size > MAX_MARKER_BYTES:
        return f"{NO_MARKER}: its {MARKER} is larger than a marker"
    return None


def _records(data: bytes) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str]:
    records = []
    for line in data.splitlines():
        with contextlib.suppress(ValueError, RecursionError):  # [[[[... nests too deep
            value = json.loads(line)
            if isinstance(value, dict):
                records.append(value)
    if not records or records[0].get("tool") != "starvecheck":
        return None, [], NO_MARKER
    owner = records[0]
    if type(owner.get("pid")) is not int or type(owner.get("uid")) is not int:
        return None, [], NO_MARKER
    return owner, records[1:], ""


def alive(owner: dict[str, Any]) -> bool | None:
    """Whether the marker's creator still runs: None where this machine cannot tell
    (made on another host, as on shared storage)."""
    if owner.get("host") != socket.gethostname():
        return None
    if owner.get("boot_id") and boot_id() and owner["boot_id"] != boot_id():
        return False  # rebooted since: every process of then is gone
    ticks = start_ticks(owner["pid"])
    if ticks is None:
        return False  # no such process
    return owner.get("start_ticks") is None or ticks == owner["start_ticks"]


def scan(path: str) -> list[Leftover]:
    """Every `starvecheck-*` directory directly in `path`, with whether it may be
    removed (its creator gone) and, where not, why. Entries that are not directories
    (files, FIFOs, links) are not starvecheck's and are skipped. OSError where `path`
    itself cannot be opened or listed (no permission): "nothing there" would be false;
    nothing else raises."""
    path_fd = os.open(path, DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        names = os.listdir(path_fd)
    except OSError:
        os.close(path_fd)
        raise
    found = []
    try:
        for name in sorted(e for e in names if e.startswith(PREFIX)):
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=path_fd)
            except OSError:
                continue  # not a directory (or a link to one): not ours
            try:
                owner, extras, why = _marker(fd)
                st = os.fstat(fd)
            except OSError:
                continue
            finally:
                os.close(fd)
            full = os.path.join(path, name)
            found.append(_judge(full, owner, extras, why, st))
    except OSError:
        pass
    finally:
        os.close(path_fd)
    return found


def _judge(
    path: str, owner: dict[str, Any] | None, extras: list[Any], why: str, st: os.stat_result
) -> Leftover:
    ident = (st.st_dev, st.st_ino)
    if owner is None:
        return Leftover(path, None, (), why or NO_MARKER, ident=ident)
    if st.st_uid != os.geteuid():
        why = f"the directory belongs to uid {st.st_uid}, not to you"
        return Leftover(path, owner, (), why, ident=ident)
    if owner["uid"] != st.st_uid:
        why = "its marker names another owner than the directory's"
        return Leftover(path, owner, (), why, ident=ident)
    running = alive(owner)
    if running is None:
        why = f"made on host {owner.get('host')}: run clean there"
        return Leftover(path, owner, (), why, ident=ident)
    if running:
        why = f"in use: pid {owner['pid']} is still running"
        return Leftover(path, owner, (), why, ident=ident)
    kept = any(e.get("kept") is True for e in extras)
    others = tuple(e for e in extras if "kept" not in e)
    return Leftover(path, owner, others, kept=kept, ident=ident)


def dead(path: str) -> list[Leftover]:
    """What runs that were killed left in `path` (not what --keep kept); none where
    `path` cannot be listed (a run says so itself when it writes there)."""
    try:
        found = scan(path)
    except OSError:
        return []
    return [x for x in found if x.removable and not x.kept]


_reported: set[str] = set()


def report(path: str, warn: Callable[[str], None]) -> None:
    """Warn, once a run per PATH, about what killed runs left in it."""
    if path in _reported:
        return
    _reported.add(path)
    found = dead(path)
    if found:
        names = ", ".join(os.path.basename(x.path) for x in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        warn(
            f"{path} holds {len(found)} scratch director{'ies' if len(found) > 1 else 'y'} of "
            f"starvecheck runs that were killed ({names}{more}): `starvecheck clean {path}` "
            "removes them"
        )
