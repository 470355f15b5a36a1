"""A path walked one name at a time to the directory that holds its last name, so that
no symbolic link another user could point elsewhere is followed (core/outputs.py writes
there).

- Each name is opened O_PATH|O_NOFOLLOW from the directory before it (a relative path
  from the working directory); `..` is the kernel's, the physical parent. Nothing is
  opened for reading or writing, and no FIFO or device is opened at all.
- A symbolic link on the way is followed only where it is owned by root or by us (the
  effective uid): /var/run -> /run, /dev/fd, a link of our own. Whoever owns a link
  decides where it leads: another user's /tmp/x -> /root/private would send root's file
  into a directory only root may write, so it is `Foreign`, whatever directory holds
  it. Its text is read from the link held (readlinkat), never looked up again by name,
  and walked the same way; at most MAX_LINKS links in all (the kernel's own bound),
  then ELOOP.
- A link of /proc's (/proc/self, /proc/self/fd/1, /proc/PID/cwd) names an open file or
  a process's directory, not a path: once its owner is checked the kernel follows it.

`stages/attach/source.py` walks a job's paths its own way: it follows no link at all
and checks each directory with the job's rights, not ours.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass

MAX_LINKS = 40  # the kernel's MAXSYMLINKS
_START = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_NAME = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class Foreign(Exception):
    """A symbolic link on the path owned by another user (neither root nor us)."""

    def __init__(self, where: str, uid: int) -> None:
        super().__init__(f"{where}: a symbolic link of uid {uid}")
        self.where, self.uid = where, uid


class Dangling(Exception):
    """The link named last leads into a directory that is not there."""


@dataclass
class Place:
    """Where a path's last name is: `name` in the directory `dir_fd` (an O_PATH
    descriptor, which `close()` closes), `shown` being that directory as walked."""

    dir_fd: int
    name: str
    shown: str
    link: bool = False  # `name` was reached by following a link named last
    proc: bool = False  # `name` is a link of /proc's, for the kernel to follow

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.dir_fd)

    def __enter__(self) -> Place:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def place(path: str) -> Place:
    """The Place of `path`'s last name (module docstring), to be closed. A link named
    last is followed as those on the way are, to the name its text ends with; that
    name need not exist. Raises Foreign, Dangling, or OSError naming the component (its
    `filename`) where the walk stopped."""
    return _walk(path)


def _names(text: str) -> list[str]:
    """A path's names, last first (a stack: the next one is popped)."""
    return [n for n in reversed(text.split("/")) if n not in ("", ".")]


def _join(shown: str, name: str) -> str:
    return f"{shown.rstrip('/')}/{name}" if shown else name


def _proc_dev() -> int | None:
    try:
        return os.stat("/proc").st_dev
    except OSError:
        return None


def _walk(path: str) -> Place:
    absolute = path.startswith("/")
    at = os.open("/" if absolute else ".", _START)
    shown = "/" if absolute else ""
    todo = _names(path) or ["."]
    links, through = 0, False  # `through`: following the link named last
    proc = _proc_dev()
    try:
        while True:
            name = todo.pop()
            last = not todo
            where = _join(shown, name)
            if last and name == "..":
                return Place(at, name, shown, through)
            try:
                fd = os.open(name, _NAME, dir_fd=at)
            except FileNotFoundError:
                if last:
                    return Place(at, name, shown, through)
                if through:
                    raise Dangling(where) from None
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), where) from None
            except OSError as e:
                raise OSError(e.errno, e.strerror, where) from None
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode) and not last:
                    os.close(at)
                    at, fd, shown = fd, -1, where
                    continue
                if not stat.S_ISLNK(st.st_mode):
                    if not last:
                        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), where)
                    return Place(at, name, shown, through)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), where)
                if st.st_uid not in (0, os.geteuid()):
                    raise Foreign(where, st.st_uid)
                through = through or last
                if proc is not None and os.fstat(at).st_dev == proc:
                    if last:
                        return Place(at, name, shown, True, proc=True)
                    new = os.open(name, _START, dir_fd=at)  # the kernel follows it
                    os.close(at)
                    at, shown = new, where
                    continue
                text = os.readlink("", dir_fd=fd)  # the link held, not looked up again
                if text.startswith("/"):
                    new = os.open("/", _START)
                    os.close(at)
                    at, shown = new, "/"
                todo.extend(_names(text) or ["."])
            finally:
                if fd >= 0:
                    os.close(fd)
    except BaseException:
        os.close(at)
        raise
