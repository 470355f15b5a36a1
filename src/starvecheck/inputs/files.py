"""The user's files, read: bounded in bytes and in time, and only what is a file.

docs/architecture.md, principle 7: a trace, a workload file, a dataset or a lengths file is
untrusted input. Each is looked at (stat) before it is opened: a directory, a FIFO
(opening one waits for a writer, for ever if none comes), a device (/dev/zero never
ends), a socket, or a file of a kernel interface (/proc, /sys) is refused in one line.
What is read is counted as it is read, gunzipped bytes included, and past the reader's
limit it stops with one line: a 14 MB gzip of whitespace is 14 GB once unpacked.

A pipe is meant where `-` (standard input) is, and where the shell hands one over as a
path (/dev/stdin, a process substitution such as `<(zcat t.json.gz)`, which is
/dev/fd/63): it is read as it comes, and one that stays silent for IDLE_TIMEOUT_S (a
terminal nobody types in, a writer that never closes) ends in one line.
"""

from __future__ import annotations

import gzip
import io
import os
import select
import stat
import sys
from pathlib import Path
from typing import IO, Any

from starvecheck.core import surroundings
from starvecheck.core.status import UsageError
from starvecheck.core.units import format_bytes

STDIN = "-"
GZIP_MAGIC = b"\x1f\x8b"
# How long a pipe or standard input may send nothing before the run ends (seconds).
IDLE_TIMEOUT_S = 60.0
CHUNK = 1 << 20

# Filesystems that hold no data: a kernel's views (/proc, /sys, ...). Measuring there
# read 0 B free and wrote nowhere sensible; a file there is an interface, not input
# (/sys/kernel/tracing/trace_pipe never ends, /proc/version cannot be written).
PSEUDO_FS = {
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
    "securityfs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs", "binfmt_misc",
    "autofs", "efivarfs", "selinuxfs", "rpc_pipefs", "nsfs",
}  # fmt: skip

_NOT_A_FILE = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def fstype(path: str) -> str | None:
    """The type of the filesystem that holds `path` (as /proc/self/mounts says), or None."""
    from starvecheck.probe.mounts import mount_for, read_mounts
    from starvecheck.probe.sysroot import SysRoot

    mounts = read_mounts(SysRoot(Path("/"))).value
    mount = mount_for(mounts, path) if mounts else None
    return mount.fstype if mount is not None else None


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    return next((what for test, what in _NOT_A_FILE if test(mode)), "not a regular file")


def _anonymous_pipe(path: str) -> bool:
    """A pipe the shell handed over by a name in /proc (/dev/stdin, /dev/fd/63): its
    link ends in `pipe:[N]`, no name on any filesystem; a FIFO made with mkfifo has one."""
    return not os.path.lexists(os.path.realpath(path))


def check(path: str, where: str, pipes: bool = True) -> bool:
    """Whether `path` is a pipe to read as a stream (True; only with `pipes`) or a
    regular file (False). Anything else is one UsageError, before anything opens it."""
    surroundings.check_relative(where, path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except OSError as e:
        raise UsageError(f"{where}: {e.strerror or type(e).__name__}") from None
    if stat.S_ISREG(st.st_mode):
        if fstype(os.path.realpath(path)) in PSEUDO_FS:
            raise UsageError(f"{where}: a file of a kernel interface, not input")
        return False
    if stat.S_ISFIFO(st.st_mode) and pipes and _anonymous_pipe(path):
        return True
    what = kind_of(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{where}: is a directory, not a file")
    raise UsageError(f"{where}: {what}, not a regular file (give a file)")


class TooLarge(UsageError):
    """Past a reader's limit."""


class _Timed(io.RawIOBase):
    """A pipe or standard input, read as bytes come: silent for `timeout_s`, it ends
    in one line. The descriptor is closed with it only where it was opened here."""

    def __init__(self, fd: int, where: str, timeout_s: float, own: bool) -> None:
        super().__init__()
        self.fd, self.where, self.timeout_s, self.own = fd, where, timeout_s, own

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while True:
            ready, _, _ = select.select([self.fd], [], [], self.timeout_s)
            if not ready:
                raise UsageError(
                    f"{self.where}: nothing came for {self.timeout_s:g} s (a terminal, or a "
                    "pipe whose writer never ends it): give a file, or end the input"
                )
            try:
                data = os.read(self.fd, len(b))
            except BlockingIOError:  # ready, then taken by someone else
                continue
            b[: len(data)] = data
            return len(data)

    def close(self) -> None:
        if not self.closed and self.own:
            os.close(self.fd)
        super().close()


class _Bounded(io.RawIOBase):
    """What is read from `inner`, counted: more than `limit` bytes end in one line."""

    def __init__(self, inner: Any, limit: int | None, message: str) -> None:
        super().__init__()
        self.inner, self.limit, self.message, self.count = inner, limit, message, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self.inner.readinto(b)
        self.count += n or 0
        if self.limit is not None and self.count > self.limit:
            raise TooLarge(self.message)
        return n or 0

    def close(self) -> None:
        if not self.closed:
            self.inner.close()
        super().close()


def _source(
    path: str, where: str, timeout_s: float, stdin: IO[bytes] | IO[str] | None
) -> tuple[Any, bool]:
    """(raw binary stream, whether it is a stream of unknown length)."""
    if path == STDIN:
        return _stdin(where, timeout_s, stdin), True
    pipe = check(path, where)
    try:
        # O_NONBLOCK: should the file have become a FIFO since check(), opening it
        # does not wait for a writer; fstat says what was opened.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UsageError(f"{where}: {e.strerror or type(e).__name__}") from None
    mode = os.fstat(fd).st_mode
    if pipe and stat.S_ISFIFO(mode):
        return _Timed(fd, where, timeout_s, own=True), True
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UsageError(f"{where}: {kind_of(mode)}, not a regular file (give a file)")
    os.set_blocking(fd, True)
    return io.FileIO(fd, "rb", closefd=True), False


def _stdin(where: str, timeout_s: float, stdin: IO[bytes] | IO[str] | None) -> io.RawIOBase:
    """Standard input as bytes: its descriptor, read with the idle time limit, where
    it has one; what a test hands over (a StringIO, a BytesIO) as it is."""
    f = sys.stdin if stdin is None else stdin
    if f is None:  # started with standard input closed (`<&-`)
        raise UsageError(f"{where}: standard input is closed")
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return _Reading(f)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return io.FileIO(fd, "rb", closefd=False)
    # A terminal or a pipe waits for its writer; /dev/null ends at once; any other
    # device (`< /dev/zero`) or a directory is no input.
    devnull = stat.S_ISCHR(st.st_mode) and st.st_rdev == os.stat(os.devnull).st_rdev
    if stat.S_ISDIR(st.st_mode) or (stat.S_ISCHR(st.st_mode) and not os.isatty(fd) and not devnull):
        raise UsageError(f"{where}: standard input is {kind_of(st.st_mode)}, not a file or a pipe")
    return _Timed(fd, where, timeout_s, own=False)


class _Reading(io.RawIOBase):
    """A stream without a descriptor (a test's StringIO or BytesIO) as raw bytes, text
    as UTF-8."""

    def __init__(self, f: IO[Any]) -> None:
        super().__init__()
        self.f, self.pending = f, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if not self.pending:
            data = self.f.read(CHUNK)
            self.pending = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        n = min(len(b), len(self.pending))
        b[:n], self.pending = self.pending[:n], self.pending[n:]
        return n


def open_input(
    path: str,
    where: str,
    limit: int | None = None,
    lift: str = "",
    gunzip: bool | None = None,
    timeout_s: float | None = None,
    stdin: IO[bytes] | IO[str] | None = None,
) -> io.BufferedReader:
    """`path` (`-`: standard input) as a binary stream: checked first, gunzipped where
    `gunzip` says (None: where it starts as gzip does), and bounded: more than `limit`
    bytes of what it holds (unpacked) is one line saying so, `lift` saying how to read
    more. A regular file is bounded by its size too, and refused before it is read."""
    raw, streamed = _source(path, where, IDLE_TIMEOUT_S if timeout_s is None else timeout_s, stdin)
    buffered = io.BufferedReader(raw, CHUNK)
    try:
        zipped = buffered.peek(2)[:2] == GZIP_MAGIC if gunzip is None else gunzip
    except BaseException:
        buffered.close()
        raise
    unpacked = "unpacked " if zipped else ""
    message = f"{where}: more than {format_bytes(limit)} {unpacked}(the limit{lift})"
    if limit is not None and not zipped and not streamed:
        size = os.fstat(raw.fileno()).st_size
        if size > limit:
            buffered.close()
            raise TooLarge(
                f"{where}: {format_bytes(size)}, over {format_bytes(limit)} (the limit{lift})"
            )
    inner: Any = gzip.GzipFile(fileobj=buffered, mode="rb") if zipped else buffered
    return io.BufferedReader(_Bounded(inner, limit, message), CHUNK)


def read_all(f: IO[bytes]) -> bytearray:
    """Everything `f` holds, read a chunk at a time into one buffer (no second copy)."""
    out = bytearray()
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            return out
        out += chunk
