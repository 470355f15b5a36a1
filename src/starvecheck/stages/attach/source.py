"""The line of source a sampled frame names (`attach`): a `.to(device)` or an `.item()`
is C, not a Python frame, so the frame of the user's own code that calls it is read.

The path comes from another process's memory, and attach often runs as root: a job's
file is read with the job's rights or not at all.

- **Where**: in the job's own root (/proc/PID/root: a container's files, not the
  node's), a relative name in its working directory (/proc/PID/cwd). Both are the
  kernel's links to the job's own directories, opened as such.
- **How**: walked one name at a time from there, each directory opened with
  O_PATH | O_NOFOLLOW | O_DIRECTORY from the one before, so no symbolic link is
  followed at any component (nor /proc's magic links); `..` goes back up the walk,
  never above the job's root (nor, for a relative name, above its working directory).
  The file itself is opened O_PATH | O_NOFOLLOW first: it must be a regular file of at
  most MAX_BYTES, so a FIFO, a socket or a device is never opened (opening a FIFO would
  release its writer); then it is reopened for reading through /proc/self/fd, which
  names that very file, and read once, at most MAX_BYTES.
- **Whose rights**: each directory must be searchable, and the file readable, by the
  job's own credentials (rights.py), checked on the very directory the walk holds
  (a directory swapped for a link after its check is not the one walked).

`openat2(RESOLVE_NO_SYMLINKS)` would resolve the path in one call, but the rights of
every directory on the way are checked anyway, which needs each one held: the walk
does both, on every kernel, in one code path. A file refused (a link on its path, not
a regular file, not the job's to read, too large) classifies its frames without their
line; `refused` keeps which and why, for the one caveat (`caveat()`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from starvecheck.probe.mounts import parse_mountinfo
from starvecheck.probe.sysroot import SysRoot
from starvecheck.probe.text import is_uint
from starvecheck.stages.attach import rights as rights_

MAX_BYTES = 1 << 20
MAX_FILES = 64
MAX_PATH = 4096
MAX_DEPTH = 64  # components of one path

_DIR = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_FILE = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
# through /proc/self/fd/N: a magic link to the file held, which must be followed
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

LINK = "a symbolic link on its path"
NOT_REGULAR = "not a regular file"
NOT_THEIRS = "not readable by the job's own user"
TOO_LARGE = f"larger than {MAX_BYTES >> 20} MiB"
UNKNOWN_RIGHTS = "the job's user could not be read from /proc"
ON_FUSE = "on a FUSE filesystem, whose server could make a read wait for ever"
UNKNOWN_MOUNT = "on a filesystem the job's mount table does not list"


class Refused(Exception):
    """A file not read, and why (one of the reasons above)."""


@dataclass
class JobFiles:
    """Where a job's files are found (its root, its working directory: O_PATH
    descriptors) and whose rights read them. `close()` when done."""

    root_fd: int | None
    cwd_fd: int | None
    rights: rights_.Rights | None
    mounts: Mounts | None = None  # None: not checked (a directory standing in for a root)

    @classmethod
    def of(cls, pid: int, root: SysRoot | None = None) -> JobFiles:
        root = root or SysRoot.from_environ()
        return cls(
            _open_link(root, f"/proc/{pid}/root"),
            _open_link(root, f"/proc/{pid}/cwd"),
            rights_.of_job(pid, root),
            Mounts(root, pid),
        )

    def close(self) -> None:
        for fd in (self.root_fd, self.cwd_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.root_fd = self.cwd_fd = None

    def read(self, path: str) -> bytes | None:
        """The file's bytes; None where it is not there (a name such as `<string>`);
        Refused where it is there but may not be read (see the module docstring)."""
        if not path or len(path) > MAX_PATH or "\0" in path:
            return None
        start = self.root_fd if path.startswith("/") else self.cwd_fd
        if start is None:
            return None
        if self.rights is None:
            raise Refused(UNKNOWN_RIGHTS)
        names = [n for n in path.split("/") if n and n != "."]
        if not names or len(names) > MAX_DEPTH:
            return None
        guard = self.mounts.check if self.mounts is not None else _unchecked
        return _walk(start, names, _Walk(self.rights, guard), floor_is_root=path.startswith("/"))


class Mounts:
    """The filesystem type of each of the job's mounts (/proc/PID/mountinfo): a file on
    FUSE is never touched, not even stat'ed (a FUSE server run by the job's user, with
    `allow_other`, answers attach's calls when it likes). A descriptor's mount is told
    by /proc/self/fdinfo's `mnt_id` (mount ids are the kernel's, the same in every
    namespace); one the table does not list is read again once, then refused."""

    def __init__(self, root: SysRoot, pid: int) -> None:
        self._root, self._pid = root, pid
        self._types = self._read()

    def _read(self) -> dict[int, str]:
        text = self._root.read(f"/proc/{self._pid}/mountinfo").value or ""
        return {m.mount_id: m.fstype for m in parse_mountinfo(text)}

    def check(self, fd: int) -> None:
        mnt = _mount_id(fd)
        if mnt is None:
            raise Refused(UNKNOWN_MOUNT)
        if mnt not in self._types:
            self._types = self._read()
        fstype = self._types.get(mnt)
        if fstype is None:
            raise Refused(UNKNOWN_MOUNT)
        if fstype == "fuse" or fstype.startswith(("fuse.", "fuseblk")):
            raise Refused(ON_FUSE)


def _mount_id(fd: int) -> int | None:
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            text = f.read(4096)
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "mnt_id" and is_uint(value.strip()):
            return int(value.strip())
    return None


def _unchecked(fd: int) -> None:
    pass


@dataclass(frozen=True)
class _Walk:
    rights: rights_.Rights
    guard: Callable[[int], None]  # raises Refused before a descriptor is stat'ed


def _open_link(root: SysRoot, path: str) -> int | None:
    """The job's root or working directory: /proc's link to it, followed (it is the
    kernel's, naming the job's own directory)."""
    try:
        return os.open(root.path(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def _walk(start: int, names: list[str], how: _Walk, floor_is_root: bool) -> bytes | None:
    held: list[int] = []  # directories opened on the way (closed at the end)
    try:
        at = start
        if not _searchable(at, how):
            raise Refused(NOT_THEIRS)
        trail = [at]
        for name in names[:-1]:
            if name == "..":
                if len(trail) > 1:
                    trail.pop()
                elif not floor_is_root:
                    return None  # above the working directory: not followed
                at = trail[-1]
                continue
            at = _step(at, name, held, how)
            if at is None:
                return None
            if not _searchable(at, how):
                raise Refused(NOT_THEIRS)
            trail.append(at)
        if names[-1] == "..":
            return None
        return _read_file(at, names[-1], how)
    finally:
        for fd in held:
            os.close(fd)


def _step(at: int, name: str, held: list[int], how: _Walk) -> int | None:
    try:
        fd = os.open(name, _DIR, dir_fd=at)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(at, name):
            raise Refused(LINK) from None
        return None  # not there (a file named as a directory is no path either)
    held.append(fd)
    how.guard(fd)
    return fd if stat.S_ISDIR(os.fstat(fd).st_mode) else None


def _is_link(at: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=at, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _searchable(fd: int, how: _Walk) -> bool:
    how.guard(fd)
    return rights_.allowed(how.rights, fd, os.fstat(fd), rights_.SEARCH)


def _read_file(at: int, name: str, how: _Walk) -> bytes | None:
    try:
        fd = os.open(name, _FILE, dir_fd=at)
    except OSError:
        return None
    try:
        how.guard(fd)
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            raise Refused(LINK)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(NOT_REGULAR)
        if st.st_size > MAX_BYTES:
            raise Refused(TOO_LARGE)
        if not rights_.allowed(how.rights, fd, st, rights_.READ):
            raise Refused(NOT_THEIRS)
        try:  # the very file held, opened for reading (a regular file: never blocks)
            rd = os.open(f"/proc/self/fd/{fd}", _READ)
        except OSError:
            return None
        with os.fdopen(rd, "rb") as f:
            again = os.fstat(f.fileno())
            if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
                return None
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise Refused(TOO_LARGE)  # it grew since
        return data
    finally:
        os.close(fd)


@dataclass
class Lines:
    """(file, line) -> the line's text, or None; each file read at most once, with the
    job's rights (JobFiles). `refused`: the files not read, and why; `unread`: how many
    times a line of one was asked for (a sampled stack classified without it)."""

    files: JobFiles | None
    texts: dict[str, list[str] | None] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    unread: int = 0

    @classmethod
    def of(cls, pid: int, root: SysRoot | None = None) -> Lines:
        return cls(JobFiles.of(pid, root))

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.files is not None:
            self.files.close()

    def __call__(self, file: str, line: int) -> str | None:
        if file not in self.texts:
            self.texts[file] = self._load(file) if len(self.texts) < MAX_FILES else None
        if file in self.refused:
            self.unread += 1
        lines = self.texts[file]
        if lines is None or not 0 < line <= len(lines):
            return None
        return lines[line - 1]

    def _load(self, file: str) -> list[str] | None:
        if self.files is None:
            return None
        try:
            data = self.files.read(file)
        except Refused as e:
            self.refused[file] = str(e)
            return None
        except OSError:
            return None
        return None if data is None else data.decode(errors="replace").splitlines()


def caveat(readers: list[Lines]) -> str | None:
    """One sentence for every file refused across the ranks; None where none was."""
    refused: dict[str, str] = {}
    for r in readers:
        refused.update(r.refused)
    if not refused:
        return None
    unread = sum(r.unread for r in readers)
    named = "; ".join(f"{_printable(f)} ({why})" for f, why in list(refused.items())[:3])
    more = f"; {len(refused) - 3} more" if len(refused) > 3 else ""
    files = "file" if len(refused) == 1 else "files"
    return (
        f"Source lines of {len(refused)} {files} named in the stacks not read, so "
        f"{unread} sampled stacks were classified by their frames alone: {named}{more}. "
        "A job's files are read only as regular files, reached without a symbolic "
        "link, that its own user may read"
    )


def _printable(text: str) -> str:
    safe = "".join(c if c.isprintable() else "?" for c in text)
    return safe[:120] + ("..." if len(safe) > 120 else "")
