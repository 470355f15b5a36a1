"""How samples sit on disk for a measurement (one file each, one shard, the user's
own files or byte ranges of them), shared by io, loader and profile: a `Layout` says
what to read, in which order, and how to evict and check it in the page cache."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starvecheck.stages.samples import cache
from starvecheck.stages.samples.reads import Ops

MB = 1e6  # MB/s as fio and dd print it: 10^6 bytes
BLOCK = 4096

Progress = Callable[[str, int, int], None]  # (what, done, total)


def no_progress(what: str, done: int, total: int) -> None:
    pass


@dataclass
class Layout:
    """One way the samples sit on disk, and how to evict and check it."""

    name: str  # small_files, shard, files, ranges
    ops: dict[str, Ops]  # access pattern -> what to read, in order
    paths: list[str]  # every file of the layout (for eviction and mincore)
    dir_fd: int | None
    bytes: int
    buffer_size: int
    sync: bool  # fsync before evicting: only for files starvecheck wrote
    evict_flags: int = os.O_RDONLY
    # Where only byte ranges of big files are read, residency is checked on those
    # ranges ((file index, offset, length)); otherwise on whole files.
    ranges: Sequence[tuple[int, int, int]] | None = None

    def residency(self) -> cache.Residency:
        if self.ranges is None:
            return cache.residency(self.paths, dir_fd=self.dir_fd, flags=self.evict_flags)
        total = cache.Residency(0, 0)
        by_file: dict[int, list[tuple[int, int]]] = {}
        for index, offset, length in self.ranges:
            by_file.setdefault(index, []).append((offset, length))
        for index, spans in by_file.items():
            try:
                fd = os.open(
                    self.paths[index], self.evict_flags | os.O_NOFOLLOW, dir_fd=self.dir_fd
                )
            except OSError as e:
                total = total + cache.Residency(0, 0, 1, f"{self.paths[index]}: {e.strerror}")
                continue
            try:
                for offset, length in spans:
                    total = total + cache.residency_fd(fd, offset, length)
            finally:
                os.close(fd)
        return total
