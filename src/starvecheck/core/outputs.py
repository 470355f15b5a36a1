"""The one way an output file (--json, --markdown, --plot) is written: no link followed,
never blocking, never half-written, with the mode the umask at start-up gives.

- A new file, or an existing regular one, is written under a temporary name made in
  the same directory with O_CREAT|O_EXCL|O_NOFOLLOW, synced, then renamed over the
  target (every step relative to the directory opened once). A link swapped in for the
  target at the last moment is replaced, never written through: its target is not
  touched. Where the directory takes no new name (no write permission) but the file
  itself is writable, the file is rewritten in place, opened with O_NOFOLLOW, and only
  where it is a regular file with one link.
- An existing regular file owned by another user in a sticky directory (/tmp) is
  refused, as the kernel's fs.protected_regular refuses it.
- An existing FIFO, character device or socket (/dev/null, /dev/full, a terminal, a
  pipe a reader waits on) is opened O_NONBLOCK|O_NOFOLLOW and written as asked: a FIFO
  no process reads is one line (ENXIO), a reader that takes nothing for a minute too.
  A block device is refused.
- A symbolic link named as the output is followed only to such a non-regular file
  (/dev/stdout, /dev/stderr) or to the file our own stdout or stderr already is
  (`--json /dev/stdout > out.txt`); a link to anything else is refused: starvecheck
  writes through no link (README, Reliability).
- The mode: an existing file's, else 0o666 less the umask read when this module was
  imported, at start-up, before any user code or thread could change it.
- The temporary file is removed on every failure and on Ctrl-C (signals are held
  while it exists); only a SIGKILL can leave one (`.NAME.starvecheck-PID-*.tmp`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import select
import stat
import sys

from starvecheck.core import streams
from starvecheck.core.signals import signals_held
from starvecheck.core.status import UsageError

# How long a reader (a FIFO, a terminal) may take nothing before the write gives up.
IDLE_S = 60.0
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_EXISTING = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _read_umask() -> int:
    """The umask, from /proc/self/status where it says (Linux 4.7+: read without
    changing it), else by setting and restoring it (at start-up no thread runs yet)."""
    with (
        contextlib.suppress(OSError, ValueError, IndexError),
        open("/proc/self/status", encoding="ascii", errors="replace") as f,
    ):
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8) & 0o777
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


STARTUP_UMASK = _read_umask()


class Refused(UsageError):
    """An output starvecheck will not write, said in one line."""


def write(option: str, shown: str, path: str, data: bytes) -> None:
    """Write `data` to `path` (shown to the user as `shown`, given with `option`) as the
    module docstring says; every failure is one line (`UsageError`, exit 2)."""
    try:
        _write(option, shown, path, data)
    except OSError as e:
        raise UsageError(f"{option} {shown}: cannot write it: {_why(e)}") from None


def _why(e: OSError) -> str:
    if e.errno == errno.ENXIO:
        return "no process reads it (a FIFO without a reader, or a socket); nothing written"
    return e.strerror or type(e).__name__


def _write(option: str, shown: str, path: str, data: bytes) -> None:
    directory, name = os.path.split(path)
    dir_fd = os.open(directory or ".", _DIRECTORY)
    try:
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            _through_link(option, shown, path, data)
        elif st is not None and not stat.S_ISREG(st.st_mode):
            _special(option, shown, name, dir_fd, data)
        else:
            _regular(option, shown, name, dir_fd, st, data)
    finally:
        os.close(dir_fd)


def _regular(
    option: str, shown: str, name: str, dir_fd: int, st: os.stat_result | None, data: bytes
) -> None:
    """A new file, or over an existing regular one: a temporary name, then a rename."""
    if st is not None:
        _refuse_foreign(option, shown, dir_fd, st)
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~STARTUP_UMASK
    with signals_held():
        temp = f".{name[:200]}.starvecheck-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(temp, _CREATE, 0o600, dir_fd=dir_fd)
        except PermissionError:
            if st is None:
                raise
            _in_place(name, dir_fd, data)  # the directory is closed; the file is not
            return
        try:
            try:
                with contextlib.suppress(OSError):  # vfat and some FUSE mounts keep none
                    os.fchmod(fd, mode)  # the mode asked, whatever the umask is now
                _write_all(fd, data)
                _sync(fd)
            finally:
                os.close(fd)
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise


def _refuse_foreign(option: str, shown: str, dir_fd: int, st: os.stat_result) -> None:
    """fs.protected_regular's rule: in a sticky directory writable by others, a file
    owned neither by us nor by the directory's owner is someone's bait."""
    d = os.fstat(dir_fd)
    sticky_shared = d.st_mode & stat.S_ISVTX and d.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if sticky_shared and st.st_uid not in (os.geteuid(), d.st_uid):
        raise Refused(
            f"{option} {shown}: an existing file of another user (uid {st.st_uid}) in a "
            "shared sticky directory: starvecheck does not replace it; give a new name"
        )


def _in_place(name: str, dir_fd: int, data: bytes) -> None:
    fd = os.open(name, _EXISTING | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(errno.EPERM, "not a regular file of one link, and the directory "
                          "takes no new file to put in its place")  # fmt: skip
        os.ftruncate(fd, 0)
        _write_all(fd, data)
        _sync(fd)
    finally:
        os.close(fd)


def _special(option: str, shown: str, name: str, dir_fd: int, data: bytes) -> None:
    """An existing FIFO, character device or socket: written as asked, never blocking."""
    fd = os.open(name, _EXISTING | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        _check_special(option, shown, fd)
        _write_all(fd, data)
    finally:
        os.close(fd)


def _check_special(option: str, shown: str, fd: int) -> None:
    mode = os.fstat(fd).st_mode
    if stat.S_ISBLK(mode):
        raise Refused(f"{option} {shown}: a block device: starvecheck writes no disk")
    if stat.S_ISDIR(mode):
        raise Refused(f"{option} {shown}: is a directory")
    if stat.S_ISREG(mode):  # swapped in since it was looked at
        raise Refused(f"{option} {shown}: changed while being written: try again")


def _through_link(option: str, shown: str, path: str, data: bytes) -> None:
    """A symbolic link: followed only to a non-regular file, or to our own stdout or
    stderr (/dev/stdout is a link to /proc/self/fd/1). Once the user's code moved fd 1
    to stderr (core/streams.py), a name of fd 1 is the real stdout, kept aside."""
    if streams.names_stdout(path):
        streams.flush()
        _write_all(streams.stdout_fd(), data)
        return
    try:
        fd = os.open(path, _EXISTING)
    except FileNotFoundError:
        fd = -1
    if fd < 0:
        raise Refused(f"{option} {shown}: a symbolic link to nothing: {_NO_LINK}")
    try:
        st = os.fstat(fd)
        own = _own_stream(st)
        if own is not None:
            sys.stderr.flush() if own == 2 else (sys.stdout.flush(), streams.flush())
            _write_all(own, data)  # at the stream's own offset, as a shell's >> would
            return
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            raise Refused(f"{option} {shown}: a symbolic link: {_NO_LINK}")
        _check_special(option, shown, fd)
        _write_all(fd, data)
    finally:
        os.close(fd)


_NO_LINK = "starvecheck writes through no link; name the file itself"


def refusal(path: str) -> str | None:
    """Why `path` can never be an output, where that is known before anything is
    measured (the write checks again): a link to nothing, or to a regular file or a
    directory that is not our own stdout or stderr; a block device."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # a new file, or an error the other checks word
    if stat.S_ISBLK(st.st_mode):
        return "a block device: starvecheck writes no disk"
    if not stat.S_ISLNK(st.st_mode):
        return None
    try:
        target = os.stat(path)
    except OSError:
        return f"a symbolic link to nothing: {_NO_LINK}"
    if stat.S_ISBLK(target.st_mode):
        return f"a symbolic link to a block device: {_NO_LINK}"
    if (stat.S_ISREG(target.st_mode) and _own_stream(target) is None) or stat.S_ISDIR(
        target.st_mode
    ):
        return f"a symbolic link: {_NO_LINK}"
    return None


def _own_stream(st: os.stat_result) -> int | None:
    """The descriptor of our stdout (core/streams.stdout_fd) or stderr (2) where `st` is
    the file it already writes to."""
    for fd in (streams.stdout_fd(), 2):
        with contextlib.suppress(OSError):
            own = os.fstat(fd)
            if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISREG(own.st_mode):
                return fd
    return None


def _sync(fd: int) -> None:
    """The data on disk before the rename makes it the report; a filesystem that cannot
    sync (EINVAL, ENOTSUP: some FUSE mounts) is no reason to lose the report."""
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.ENOSYS):
            raise


def _write_all(fd: int, data: bytes) -> None:
    """All of `data`; a non-blocking reader that takes nothing for IDLE_S is an error."""
    view = memoryview(data)
    while view:
        try:
            done = os.write(fd, view)
        except BlockingIOError:
            _, ready, _ = select.select([], [fd], [], IDLE_S)
            if not ready:
                raise OSError(errno.ETIMEDOUT, f"nothing read it for {IDLE_S:g} s") from None
            continue
        view = view[done:]
