"""Page-cache control: evict a file, drop every cache, and check what is still resident.

Eviction without root is `posix_fadvise(POSIX_FADV_DONTNEED)` on each file: the
kernel drops the file's clean pages. Dirty pages are not dropped, so a file we
wrote is fsync'd first. Some filesystems ignore the advice (tmpfs keeps its pages
because they are the file; some FUSE mounts cache in the daemon), which is why
every cold run is checked with `mincore(2)` instead of trusted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass

DROP_CACHES = "/proc/sys/vm/drop_caches"
# mincore(2) sets bit 0 of each vector byte for a resident page; the other bits
# are reserved. This table maps every byte to its bit 0.
_BIT0 = bytes(b & 1 for b in range(256))
# Map large files a window at a time: the vector is one byte per page, and a
# window keeps the address space used by one call bounded.
_WINDOW = 1 << 30


class _Libc:
    """mmap/munmap/mincore through ctypes: Python's mmap module has no mincore, and
    its read-only maps do not expose an address."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.restype = ctypes.c_int
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.lib = lib

    def resident_pages(self, fd: int, offset: int, length: int) -> int:
        """Resident pages in [offset, offset+length) of `fd`; offset is page-aligned."""
        addr = self.lib.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap: {os.strerror(err)}")
        try:
            pages = (length + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if self.lib.mincore(addr, length, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore: {os.strerror(err)}")
            return bytes(vec).translate(_BIT0).count(1)
        finally:
            self.lib.munmap(addr, length)


_libc: _Libc | None = None


def _get_libc() -> _Libc:
    global _libc
    if _libc is None:
        _libc = _Libc()
    return _libc


@dataclass(frozen=True)
class Residency:
    resident_pages: int
    total_pages: int
    unknown_files: int = 0  # files whose residency could not be read (mmap refused)
    reason: str | None = None  # the first such failure

    @property
    def fraction(self) -> float | None:
        if self.total_pages == 0:
            return None if self.unknown_files else 0.0
        return self.resident_pages / self.total_pages

    def __add__(self, other: Residency) -> Residency:
        return Residency(
            self.resident_pages + other.resident_pages,
            self.total_pages + other.total_pages,
            self.unknown_files + other.unknown_files,
            self.reason or other.reason,
        )


def residency_fd(fd: int, offset: int = 0, length: int | None = None) -> Residency:
    """How many pages of the file (or of a byte range of it) are in the page cache."""
    size = os.fstat(fd).st_size
    end = size if length is None else min(size, offset + length)
    start = offset - offset % mmap.PAGESIZE
    if end <= start:
        return Residency(0, 0)
    resident = total = 0
    try:
        pos = start
        while pos < end:
            n = min(_WINDOW, end - pos)
            resident += _get_libc().resident_pages(fd, pos, n)
            total += (n + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            pos += n
    except OSError as e:
        return Residency(0, 0, 1, f"{e.strerror or e}")
    return Residency(resident, total)


def residency(
    paths: Iterable[str | bytes], dir_fd: int | None = None, flags: int = os.O_RDONLY
) -> Residency:
    """Residency summed over files (opened relative to `dir_fd` where given, with
    `flags`: pass O_NOATIME for other people's files, since the mmap counts as an
    access)."""
    total = Residency(0, 0)
    for path in paths:
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError as e:
            total = total + Residency(0, 0, 1, f"{os.fsdecode(path)}: {e.strerror}")
            continue
        try:
            total = total + residency_fd(fd)
        finally:
            os.close(fd)
    return total


def evict_fd(fd: int, *, sync: bool) -> None:
    """Ask the kernel to drop the file's pages. `sync` first writes dirty pages back
    (they cannot be dropped otherwise); only for files we wrote ourselves."""
    if sync:
        os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def evict(
    paths: Iterable[str | bytes],
    *,
    dir_fd: int | None = None,
    sync: bool,
    flags: int = os.O_RDONLY,
) -> None:
    for path in paths:
        fd = os.open(path, flags | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            evict_fd(fd, sync=sync)
        finally:
            os.close(fd)


def drop_caches_problem() -> str | None:
    """Why `drop_all_caches` cannot work here, or None. Opens the file for writing
    without writing to it."""
    if os.geteuid() != 0:
        return "needs root (it drops the page cache of the whole machine)"
    try:
        fd = os.open(DROP_CACHES, os.O_WRONLY)
    except OSError as e:
        read_only = e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        where = " (read-only inside most containers; run it on the host)" if read_only else ""
        return f"cannot open {DROP_CACHES} for writing: {e.strerror}{where}"
    os.close(fd)
    return None


def drop_all_caches() -> None:
    """sync, then drop the page cache, dentries and inodes of the whole machine
    (`echo 3 > /proc/sys/vm/drop_caches`): also makes file metadata cold, which
    fadvise cannot. System-wide: only behind --drop-caches."""
    os.sync()
    fd = os.open(DROP_CACHES, os.O_WRONLY)
    try:
        os.write(fd, b"3\n")
    finally:
        os.close(fd)
