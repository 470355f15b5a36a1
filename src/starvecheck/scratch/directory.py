"""The one place that creates benchmark data on disk, and removes it again.

Rules (docs/architecture.md, principle 3, "Do no harm"):
- Everything lives in a fresh directory made here with mkdir (never reused);
  every later path is opened relative to that directory's descriptor, with
  O_NOFOLLOW, so a symlink planted inside cannot send a write or an unlink
  anywhere else.
- Every name is recorded *before* it is created (with O_EXCL), so an interrupt at
  any point leaves nothing unrecorded; cleanup unlinks exactly the recorded names
  and then rmdirs. Nothing is ever removed recursively: a directory holding
  something starvecheck did not put there is left in place and reported. The one
  exception to "recorded before": files a library writes itself (MDSWriter) into a
  subdirectory made here, recorded by `adopt` right after, or on the way out.
- SIGTERM and SIGHUP become exceptions (as Ctrl-C already is) while scratch data
  exists, so `finally` runs; signals arriving during creation of the directory
  or during cleanup are held and delivered afterwards (core/signals.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from starvecheck.core.signals import signals_held
from starvecheck.core.status import UsageError
from starvecheck.core.units import format_bytes
from starvecheck.scratch import leftovers

_DIR_FLAGS = leftovers.DIR_FLAGS
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Scratch:
    """A fresh directory under `parent` and the files made in it, its ownership marker
    first (scratch/leftovers.py). Use as a context manager; `keep=True` leaves the data (for
    --keep). `warn`: where to say what killed runs left in `parent`."""

    parent: str
    prefix: str = "starvecheck-"
    keep: bool = False
    warn: Callable[[str], None] | None = None
    name: str = ""
    _parent_fd: int | None = None
    _parent_times: tuple[int, int] | None = None  # (atime, mtime) in ns, before we began
    _dirs: dict[str, int] = field(default_factory=dict)  # "" is the scratch root
    _subdirs: list[str] = field(default_factory=list)
    _files: list[tuple[str, str]] = field(default_factory=list)  # (subdir, name)
    leftovers: list[str] = field(default_factory=list)
    _noted: set[bytes] = field(default_factory=set)

    @property
    def path(self) -> str:
        return os.path.join(self.parent, self.name)

    def __enter__(self) -> Scratch:
        try:
            self.create()
        except BaseException:
            self.cleanup()  # __exit__ does not run when __enter__ raises
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.keep:
            self.cleanup()
        else:
            with contextlib.suppress(OSError):
                self.note({"kept": True})  # --keep: not a killed run's
            self._close_fds()
        _forget(self)

    def create(self) -> None:
        with signals_held():
            self._parent_fd = os.open(self.parent, _DIR_FLAGS & ~os.O_NOFOLLOW)
            st = os.fstat(self._parent_fd)
            self._parent_times = (st.st_atime_ns, st.st_mtime_ns)
            for _ in range(100):
                name = f"{self.prefix}{secrets.token_hex(4)}"
                try:
                    os.mkdir(name, 0o700, dir_fd=self._parent_fd)
                except FileExistsError:
                    continue
                self.name = name  # recorded at once: signals are held here
                break
            else:  # 100 collisions of 32 random bits: something else is going on
                raise FileExistsError(f"no free name for a scratch directory in {self.parent}")
            self._dirs[""] = os.open(name, _DIR_FLAGS, dir_fd=self._parent_fd)
            try:
                self.write_file(leftovers.MARKER, _line(leftovers.owner_record()))
            except OSError as e:  # a full disk, a quota: the first write says so
                raise UsageError(f"writing test data in {self.path} failed: {e.strerror}") from e
            _active.append(self)
        if self.warn is not None:
            leftovers.report(self.parent, self.warn)

    def note(self, record: dict[str, object]) -> None:
        """Add a line to the marker: something made outside the directory that this run
        removes itself, and `starvecheck clean` removes should the run be killed."""
        line = _line(record)
        if line in self._noted:
            return
        fd = os.open(
            leftovers.MARKER,
            os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
            dir_fd=self._dirs[""],
        )
        try:
            write_all(fd, line)
        finally:
            os.close(fd)
        self._noted.add(line)

    def mkdir(self, name: str) -> None:
        """A subdirectory of the scratch root (one level; enough for our layouts)."""
        self._check_name(name)
        with signals_held():
            os.mkdir(name, 0o700, dir_fd=self._dirs[""])
            self._subdirs.append(name)
            self._dirs[name] = os.open(name, _DIR_FLAGS, dir_fd=self._dirs[""])

    def dir_fd(self, subdir: str = "") -> int:
        return self._dirs[subdir]

    def new_file(self, name: str, subdir: str = "") -> int:
        """Create `name` (exclusively) and return a descriptor open for writing."""
        self._check_name(name)
        self._files.append((subdir, name))  # recorded first: see the module docstring
        try:
            return os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=self._dirs[subdir])
        except OSError:
            # Not created by us (EEXIST, ENOSPC, ...): forget the name. Only OSError:
            # an interrupt arriving just after a successful open must keep the record.
            self._files.pop()
            raise

    def write_file(self, name: str, data: bytes, subdir: str = "") -> None:
        """Create `name` (exclusively, as new_file does) holding `data`."""
        fd = self.new_file(name, subdir)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)

    def adopt(self, subdir: str) -> None:
        """Record the regular files a library wrote itself into `subdir` (MDSWriter
        opens its own files), so cleanup removes them. `subdir` was made here (mode 0700,
        fresh), so only this process writes there; call this in a `finally`, so that a
        write interrupted half-way is removed too. Anything but a regular file is not
        recorded, and is left in place and reported like any foreign file."""
        if subdir not in self._dirs:  # never made (interrupted first, or not needed)
            return
        with signals_held():
            known = {name for d, name in self._files if d == subdir}
            with os.scandir(self._dirs[subdir]) as entries:
                for entry in entries:
                    if entry.name not in known and entry.is_file(follow_symlinks=False):
                        self._files.append((subdir, entry.name))

    @staticmethod
    def _check_name(name: str) -> None:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"scratch names are single path components, not {name!r}")

    def syncfs(self) -> None:
        """Write back everything on the scratch filesystem at once: one flush instead
        of an fsync per file (10,000 fsyncs can take minutes on a journaling fs)."""
        fd = self._dirs[""]
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            if libc.syncfs(fd) == 0:
                return
        except (OSError, AttributeError):  # no libc syncfs: fall back to a global sync
            pass
        os.sync()

    def cleanup(self) -> None:
        """Remove exactly what was created, innermost first; signals wait until done."""
        _forget(self)
        if not self.name or self._parent_fd is None:
            self._close_fds()
            return
        with signals_held():
            for subdir, name in reversed(self._files):
                try:
                    os.unlink(name, dir_fd=self._dirs[subdir])
                except FileNotFoundError:
                    pass  # recorded but never created (interrupted), or already gone
                except OSError as e:
                    self.leftovers.append(f"{self._rel(subdir, name)}: {e.strerror}")
            self._files.clear()
            for subdir in reversed(self._subdirs):
                self._rmdir(subdir, self._dirs[""], self._rel(subdir))
            self._subdirs.clear()
            self._close_fds(keep_parent=True)
            if self._rmdir(self.name, self._parent_fd, self.path) and not self.leftovers:
                self._restore_parent_times()
            os.close(self._parent_fd)
            self._parent_fd = None

    def _rmdir(self, name: str, dir_fd: int, shown: str) -> bool:
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        except OSError as e:
            # Not empty: something starvecheck did not create is inside. Leave it.
            self.leftovers.append(f"{shown}: {e.strerror}")
            return False
        return True

    def _restore_parent_times(self) -> None:
        """Creating and removing the scratch directory moved the parent's modification
        time; put it back, so PATH is left as it was (its ctime cannot be restored)."""
        if self._parent_times is None or self._parent_fd is None:
            return
        with contextlib.suppress(OSError):  # not the owner: the times stay moved
            os.utime(self._parent_fd, ns=self._parent_times)

    def _rel(self, subdir: str, name: str = "") -> str:
        return os.path.join(self.path, subdir, name).rstrip("/")

    def _close_fds(self, keep_parent: bool = False) -> None:
        for fd in self._dirs.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._dirs.clear()
        if not keep_parent and self._parent_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._parent_fd)
            self._parent_fd = None


# Scratch directories of this process that exist now: `note_all` records in each.
_active: list[Scratch] = []


def _forget(scratch: Scratch) -> None:
    _active[:] = [x for x in _active if x is not scratch]


def recording() -> bool:
    """Whether a scratch directory of this process is live: `note_all` has a marker."""
    return bool(_active)


def note_all(record: dict[str, object]) -> None:
    """Record in every live scratch directory's marker something made outside it."""
    for scratch in _active:
        if "" in scratch._dirs:
            with contextlib.suppress(OSError):
                scratch.note(record)


def _line(record: dict[str, object]) -> bytes:
    return json.dumps(record, sort_keys=True).encode() + b"\n"


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a write may take only part)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# --- free space, checked before anything is written --------------------------------

# Free space starvecheck leaves untouched on the filesystem it writes to.
MARGIN_BYTES = 256 << 20
MARGIN_SHARE = 0.10
BLOCK = 4096


def space_needed(samples: int, sample_size: int) -> int:
    """Bytes the generated data takes: every sample twice (its own file and the
    shard), each small file rounded up to whole blocks."""
    per_file = -(-sample_size // BLOCK) * BLOCK
    return samples * per_file + samples * sample_size + BLOCK * (samples // 64 + 4)


# The remedies `space_problem` names: io's and loader's own options (the defaults), and
# doctor's, which has no --samples nor --existing.
SMALLER = "use fewer --samples or a smaller --sample-size"
ELSEWHERE = "give a PATH on a filesystem with more free space"
OR_EXISTING = f"{ELSEWHERE}, or read files already there with --existing"


def doctor_remedies(quick: bool) -> dict[str, str]:
    """`space_problem`'s remedies for doctor: its own options."""
    return {
        "smaller": "use a smaller --sample-size" + ("" if quick else " or --quick"),
        "elsewhere": f"{ELSEWHERE}, or leave out the stages that write (--skip io,loader)",
    }


def space_problem(
    path: str,
    samples: int,
    sample_size: int,
    need: int | None = None,
    *,
    smaller: str = SMALLER,
    elsewhere: str = ELSEWHERE,
) -> str | None:
    """Why the data cannot be written under `path`, or None. `need`: bytes the data
    takes, where not io's own layouts (`space_needed`). The remedy is the command's
    own: `smaller` (its options for less data) where less data would fit, `elsewhere`
    where the margin alone is more than is free and no size of data would."""
    need = space_needed(samples, sample_size) if need is None else need
    margin = MARGIN_BYTES + int(need * MARGIN_SHARE)
    try:
        st = os.statvfs(path)
    except OSError as e:
        return f"cannot read free space of {path}: {e.strerror}"
    free = st.f_bavail * st.f_frsize
    if free < need + margin:
        return (
            f"{path}: not enough free space: the test data needs {format_bytes(need)} plus a "
            f"{format_bytes(margin)} margin, {format_bytes(free)} is free; "
            + (
                smaller
                if free > MARGIN_BYTES
                else f"the margin alone is more than is free: {elsewhere}"
            )
        )
    if st.f_files and st.f_favail < samples + 16:  # f_files 0: no inode limit (btrfs, ...)
        return f"{path}: not enough free inodes: {samples + 16:,} needed, {st.f_favail:,} free"
    return None
