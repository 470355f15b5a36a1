"""The one way an output file (--json, --markdown, --plot) is written: no link another
user could point elsewhere followed, nothing sent to another user's file, never
blocking, never half-written, with the mode the umask at start-up gives.

- Where: the path is walked one name at a time (core/walk.py), each directory held
  O_PATH, and every step below is made relative to the directory the walk ends with. A
  symbolic link on the way, or named as the output, is followed only where root or we
  own it (/var/run -> /run, /dev/stdout); another user's is refused, naming it.
- A new file, or an existing regular one, is written under a temporary name made in
  that directory with O_CREAT|O_EXCL|O_NOFOLLOW, synced, then renamed over the target.
  The temporary name is cut to fit NAME_MAX in bytes (never inside a UTF-8 character),
  so any name that may be written can be. A link swapped in for the target at the last
  moment is replaced, never written through. Where the directory takes no new name (no
  write permission) but the file itself is writable, the file is rewritten in place,
  opened with O_NOFOLLOW, and only where it is a regular file with one link.
- The kernel's sticky-directory rule (fs.protected_regular, protected_fifos, at their
  strictest, whatever the sysctls say): in a sticky directory writable by group or
  others (/tmp), an existing file, FIFO, socket or device owned neither by us nor by
  the directory's owner is someone's bait, and refused.
- An existing FIFO, character device or socket (/dev/null, /dev/full, a terminal, a
  pipe a reader waits on) is first opened O_PATH and checked, then reopened through
  /proc/self/fd for writing, O_NONBLOCK: a FIFO no process reads is one line (ENXIO), a
  reader that takes nothing for a minute too. A block device is refused.
- A link named as the output leads only to such a non-regular file (/dev/stdout,
  /dev/stderr) or to the file our own stdout or stderr already is (`--json /dev/stdout
  > out.txt`); a link to anything else is refused: starvecheck writes through no link.
- The mode: an existing file's, else 0o666 less the umask read when this module was
  imported, at start-up, before any user code or thread could change it.
- The temporary file is removed on every failure and on Ctrl-C (signals are held
  while it exists); only a SIGKILL can leave one (`.NAME.starvecheck-PID-*.tmp`).

`refusal` runs the same walk and checks before anything is measured, without writing,
so what it accepts the write can write, and what it refuses the write would too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import select
import stat
import sys

from starvecheck.core import streams, walk
from starvecheck.core.signals import signals_held
from starvecheck.core.status import UsageError

# How long a reader (a FIFO, a terminal) may take nothing before the write gives up.
IDLE_S = 60.0
NAME_MAX = 255  # bytes of one name, on Linux's every filesystem at most
PATH_MAX = 4096  # bytes of a path the kernel takes, its final NUL included
NOT_WRITABLE = "not writable"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_EXISTING = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_HELD = os.O_PATH | os.O_CLOEXEC


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


class _No(Exception):
    """Why an output is not written (the text after `OPTION PATH: `)."""


def write(option: str, shown: str, path: str, data: bytes) -> None:
    """Write `data` to `path` (shown to the user as `shown`, given with `option`) as the
    module docstring says; every failure is one line (`UsageError`, exit 2)."""
    try:
        _write(path, data)
    except _No as e:
        raise Refused(f"{option} {shown}: {e}") from None
    except OSError as e:
        raise UsageError(f"{option} {shown}: cannot write it: {_why(e)}") from None


def refusal(path: str) -> str | None:
    """Why `path` cannot take a report, known before anything is measured, or None
    where it can: the write's own walk and checks (a link of another user on the way,
    another user's file in a sticky directory, a name or path too long, a missing or
    closed directory, a directory or block device, no permission), nothing written."""
    try:
        _names_fit(path)
        with _place(path) as where:
            st = _judge(where)
            _permitted(where, st)
    except _No as e:
        return str(e)
    except FileNotFoundError:
        return f"directory {os.path.dirname(path) or '.'} does not exist"
    except OSError as e:
        return _said(e)
    return None


def permitted(dir_fd: int, name: str, mode: int) -> bool:
    """access(2) for our effective user, `name` in the directory `dir_fd` (O_PATH)."""
    return os.access(name, mode, dir_fd=dir_fd, effective_ids=True)


def _why(e: OSError) -> str:
    if e.errno == errno.ENXIO:
        return "no process reads it (a FIFO without a reader, or a socket); nothing written"
    return e.strerror or type(e).__name__


def _said(e: OSError) -> str:
    """An OSError of the walk before the run, as ls words it, with the name it met."""
    text = e.strerror or type(e).__name__
    text = text[0].lower() + text[1:]
    return f"{e.filename}: {text}" if e.filename else text


def _names_fit(path: str) -> None:
    raw = os.fsencode(path)
    if len(raw) >= PATH_MAX:
        raise _No(f"a path of {len(raw)} bytes: Linux takes at most {PATH_MAX - 1}")
    for name in raw.split(b"/"):
        if len(name) > NAME_MAX:
            raise _No(f"a name of {len(name)} bytes: a file name is at most {NAME_MAX} bytes")
    if path.endswith("/"):
        raise _No("is a directory" if os.path.isdir(path) else "names a directory (ends "
                  "with /): give a file name")  # fmt: skip


def _place(path: str) -> walk.Place:
    """walk.place, its refusals worded: a link of another user, a link to nothing, a
    directory that cannot be searched."""
    try:
        return walk.place(path)
    except walk.Foreign as e:
        raise _No(f"{e.where} is a symbolic link of another user (uid {e.uid}): starvecheck "
                  "follows no link its owner could point elsewhere; name the directory it "
                  "leads to") from None  # fmt: skip
    except walk.Dangling:
        raise _No(f"a symbolic link to nothing: {_NO_LINK}") from None
    except PermissionError as e:  # an O_PATH open needs only search permission
        where = os.path.dirname(e.filename or "") or "."
        raise _No(f"not writable: directory {where} cannot be searched (no x permission)") from None


def _judge(where: walk.Place) -> os.stat_result | None:
    """What `where` names (None: nothing yet), where a report may go there (_allowed)."""
    try:
        st = os.stat(where.name, dir_fd=where.dir_fd, follow_symlinks=where.proc)
    except FileNotFoundError:
        if where.link:
            raise _No(f"a symbolic link to nothing: {_NO_LINK}") from None
        return None
    _allowed(where, st)
    return st


_NO_LINK = "starvecheck writes through no link; name the file itself"
_KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device"}


def _allowed(where: walk.Place, st: os.stat_result) -> None:
    """The rules of the module docstring, on what was found (a stat of the name or of
    the file opened). Raises _No."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):  # a link swapped in since the walk
        raise _No(f"a symbolic link: {_NO_LINK}")
    if stat.S_ISDIR(mode):
        raise _No(f"a symbolic link: {_NO_LINK}" if where.link else "is a directory")
    if stat.S_ISBLK(mode):
        link = "a symbolic link to " if where.link else ""
        raise _No(f"{link}a block device: starvecheck writes no disk")
    if stat.S_ISREG(mode) and where.link:
        if _own_stream(st) is None:
            raise _No(f"a symbolic link: {_NO_LINK}")
        return  # our own stdout or stderr, wherever it is
    if where.proc:
        return  # one of our own descriptors (/proc/self/fd/1): its directory is no one's
    d = os.fstat(where.dir_fd)
    shared = d.st_mode & stat.S_ISVTX and d.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if shared and st.st_uid not in (os.geteuid(), d.st_uid):
        whose = f"of another user (uid {st.st_uid}) in a shared sticky directory"
        if stat.S_ISREG(mode):
            raise _No(f"an existing file {whose}: starvecheck does not replace it; give a new name")
        kind = _KINDS.get(stat.S_IFMT(mode), "file")
        raise _No(f"a {kind} {whose}: starvecheck sends it no report; give a new name")


def _permitted(where: walk.Place, st: os.stat_result | None) -> None:
    """Before the run: the permission the write will need. A new file needs a directory
    that takes one (w and x; O_PATH needs no r), an existing one its own permission."""
    if st is None:
        raw = os.fsencode(where.name)
        limit = _name_max(where.dir_fd)
        if len(raw) > limit:
            raise _No(f"a name of {len(raw)} bytes: a file name here is at most {limit} bytes")
        if not permitted(where.dir_fd, ".", os.W_OK | os.X_OK):
            raise _No(NOT_WRITABLE)
    elif not permitted(where.dir_fd, where.name, os.W_OK):
        raise _No(NOT_WRITABLE)


def _name_max(dir_fd: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        return min(os.fpathconf(dir_fd, "PC_NAME_MAX"), NAME_MAX)
    return NAME_MAX


def _write(path: str, data: bytes) -> None:
    if streams.names_stdout(path):  # fd 1 moved for the user's code (core/streams.py)
        streams.flush()
        _write_all(streams.stdout_fd(), data)  # the real stdout, kept aside
        return
    with _place(path) as where:
        st = _judge(where)
        if st is None or (stat.S_ISREG(st.st_mode) and not where.link):
            _regular(where, st, data)
        elif stat.S_ISREG(st.st_mode):  # through a link: our own stdout or stderr
            _to_own_stream(st, data)
        else:
            _special(where, data)


def _to_own_stream(st: os.stat_result, data: bytes) -> None:
    own = _own_stream(st)
    if own is None:
        raise _No("changed while being written: try again")
    if own == 2:
        sys.stderr.flush()
    else:
        sys.stdout.flush()
        streams.flush()
    _write_all(own, data)  # at the stream's own offset, as a shell's >> would


def _temporary(name: str, dir_fd: int) -> str:
    """`.NAME.starvecheck-PID-HEX.tmp`, NAME cut to fit the directory's NAME_MAX in
    bytes, never inside a UTF-8 character."""
    suffix = f".starvecheck-{os.getpid()}-{secrets.token_hex(4)}.tmp".encode()
    raw = os.fsencode(name)
    room = _name_max(dir_fd) - 1 - len(suffix)
    if len(raw) > room:
        cut = room
        while cut > 0 and raw[cut] & 0xC0 == 0x80:  # a continuation byte: back off
            cut -= 1
        raw = raw[:cut]
    return os.fsdecode(b"." + raw + suffix)


def _regular(where: walk.Place, st: os.stat_result | None, data: bytes) -> None:
    """A new file, or over an existing regular one: a temporary name, then a rename."""
    name, dir_fd = where.name, where.dir_fd
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~STARTUP_UMASK
    with signals_held():
        temp = _temporary(name, dir_fd)
        try:
            fd = os.open(temp, _CREATE, 0o600, dir_fd=dir_fd)
        except PermissionError:
            if st is None:
                raise
            _in_place(where, data)  # the directory is closed; the file is not
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


def _in_place(where: walk.Place, data: bytes) -> None:
    fd = os.open(where.name, _EXISTING | os.O_NOFOLLOW, dir_fd=where.dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(errno.EPERM, "not a regular file of one link, and the directory "
                          "takes no new file to put in its place")  # fmt: skip
        _allowed(where, st)  # what was opened
        os.ftruncate(fd, 0)
        _write_all(fd, data)
        _sync(fd)
    finally:
        os.close(fd)


def _special(where: walk.Place, data: bytes) -> None:
    """An existing FIFO, character device or socket: held O_PATH and checked, so
    another user's is never opened (opening a FIFO would release its reader), then
    written as asked, never blocking."""
    nofollow = 0 if where.proc else os.O_NOFOLLOW
    held = os.open(where.name, _HELD | nofollow, dir_fd=where.dir_fd)
    try:
        st = os.fstat(held)
        _allowed(where, st)
        if stat.S_ISREG(st.st_mode):  # swapped in since it was looked at
            raise _No("changed while being written: try again")
        try:  # this very file, whatever the name leads to now
            fd = os.open(f"/proc/self/fd/{held}", _EXISTING)
        except FileNotFoundError:  # no /proc: by name, then the same file checked
            fd = os.open(where.name, _EXISTING | nofollow, dir_fd=where.dir_fd)
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                os.close(fd)
                raise _No("changed while being written: try again") from None
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
    finally:
        os.close(held)


def _own_stream(st: os.stat_result) -> int | None:
    """The descriptor of our stdout (core/streams.stdout_fd: 1, or the real stdout kept
    aside while the user's code has fd 1) or stderr (2) where `st` is the file it
    already writes to."""
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
