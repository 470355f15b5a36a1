"""`io --existing`: a sample of the user's own dataset, read-only.

Nothing under PATH is written, renamed or deleted: files are opened O_RDONLY (and
O_NOATIME where the kernel allows it, so even access times stay put), evicted
with posix_fadvise (which changes no file, only what the kernel caches), and
read. Symlinks are not followed, so the sample stays inside PATH.
"""

from __future__ import annotations

import os
import random
import stat
from dataclasses import dataclass, field
from typing import Protocol

from starvecheck.core.metric import Caveat
from starvecheck.stages.samples.layouts import BLOCK, Layout
from starvecheck.stages.samples.reads import READ_FLAGS, FileOps, RangeOps

# A file larger than this is a shard (or an archive, a video): read in --sample-size
# byte ranges at shuffled offsets, as a shard-based loader does, not whole.
LARGE_FILE = 8 << 20
# Stop listing after this many files: listing a million-file tree on a network
# mount takes minutes, and a uniform sample of 200,000 is as good as one of all.
SCAN_LIMIT = 200_000
# Ranges are spread over at most this many large files.
MAX_LARGE_FILES = 64
FILE_BUFFER = 1 << 20


class Sampling(Protocol):
    """What the sample is drawn by (io's Plan has it): this module imports no stage."""

    @property
    def samples(self) -> int: ...
    @property
    def sample_size(self) -> int: ...
    @property
    def seed(self) -> int: ...


@dataclass
class Found:
    small: list[tuple[str, int]]  # (path, size), a uniform sample
    large: list[tuple[str, int]]
    small_seen: int = 0
    large_seen: int = 0
    symlinks: int = 0
    unreadable: int = 0
    truncated: bool = False
    owners: set[int] = field(default_factory=set)  # uids of the files seen


def discover(path: str, samples: int, rng: random.Random) -> Found:
    """Walk `path` without following symlinks; reservoir-sample its regular files."""
    found = Found([], [])

    def take(p: str, st: os.stat_result) -> None:
        if st.st_size == 0:
            return
        found.owners.add(st.st_uid)
        if st.st_size > LARGE_FILE:
            found.large_seen += 1
            _reservoir(found.large, (p, st.st_size), found.large_seen, MAX_LARGE_FILES, rng)
        else:
            found.small_seen += 1
            _reservoir(found.small, (p, st.st_size), found.small_seen, samples, rng)

    st = os.stat(path)
    if stat.S_ISREG(st.st_mode):
        take(path, st)
        return found
    stack = [path]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)  # same sample for the same seed
        except OSError:
            found.unreadable += 1
            continue
        for entry in entries:
            try:
                if entry.is_symlink():
                    found.symlinks += 1
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    if found.small_seen + found.large_seen >= SCAN_LIMIT:
                        found.truncated = True  # a file beyond the limit exists
                        return found
                    take(entry.path, entry.stat(follow_symlinks=False))
            except OSError:
                found.unreadable += 1
    return found


def _reservoir(keep: list, item: object, seen: int, size: int, rng: random.Random) -> None:
    """Algorithm R: after `seen` items, each has been kept with probability size/seen."""
    if len(keep) < size:
        keep.append(item)
    else:
        j = rng.randrange(seen)
        if j < size:
            keep[j] = item


def read_flags(owners: set[int]) -> int:
    """O_NOATIME needs ownership (or CAP_FOWNER); without it open() fails with EPERM."""
    euid = os.geteuid()
    if euid == 0 or owners <= {euid}:
        return READ_FLAGS | os.O_NOATIME
    return READ_FLAGS


def readable(paths: list[str], flags: int) -> tuple[list[str], int]:
    ok = []
    for p in paths:
        try:
            os.close(os.open(p, flags | os.O_NOFOLLOW))
        except OSError:
            continue
        ok.append(p)
    return ok, len(paths) - len(ok)


def layouts(path: str, plan: Sampling) -> tuple[list[Layout], dict, list[Caveat]]:
    """The user's files as layouts to measure, parameters describing the sample, caveats."""
    rng = random.Random(plan.seed)
    found = discover(path, plan.samples, rng)
    flags = read_flags(found.owners)
    out: list[Layout] = []

    small_paths, bad_small = readable([p for p, _ in found.small], flags)
    sizes = {p: s for p, s in found.small}
    if small_paths:
        rng.shuffle(small_paths)
        total = sum(sizes[p] for p in small_paths)
        out.append(
            Layout(
                "files",
                {"random": FileOps(small_paths, None, flags)},
                small_paths,
                None,
                total,
                FILE_BUFFER,
                sync=False,
                evict_flags=flags,
            )
        )
    large_paths, bad_large = readable([p for p, _ in found.large], flags)
    large_sizes = [dict(found.large)[p] for p in large_paths]
    if large_paths:
        ranges = _ranges(large_sizes, plan.samples, plan.sample_size, rng)
        out.append(
            Layout(
                "ranges",
                {"random": RangeOps(ranges, large_paths, None, flags)},
                large_paths,
                None,
                sum(n for _, _, n in ranges),
                plan.sample_size,
                sync=False,
                evict_flags=flags,
                ranges=ranges,
            )
        )
    small_sizes = sorted(sizes[p] for p in small_paths)
    params = {
        "existing": True,
        "files_seen": found.small_seen + found.large_seen,
        "small_files_seen": found.small_seen,
        "large_files_seen": found.large_seen,
        "files_read": len(small_paths),
        "large_files_read": len(large_paths),
        "ranges_read": len(out[-1].ops["random"]) if large_paths else 0,
        "median_file_bytes": small_sizes[len(small_sizes) // 2] if small_sizes else None,
        "large_file_threshold_bytes": LARGE_FILE,
    }
    return out, params, _caveats(found, found.unreadable + bad_small + bad_large, flags)


def _caveats(found: Found, skipped: int, flags: int) -> list[Caveat]:
    """What the sample leaves out or may touch: the listing cut short, symlinks not
    followed, `skipped` files or directories unreadable, access times without O_NOATIME."""
    caveats: list[Caveat] = []
    if found.truncated:
        caveats.append(
            Caveat(
                "io.listing-truncated",
                f"listing stopped after {SCAN_LIMIT:,} files; the sample is drawn from those",
            )
        )
    if found.symlinks:
        caveats.append(
            Caveat(
                "io.symlinks-skipped",
                f"{found.symlinks:,} symlinks not followed (the sample stays inside PATH)",
            )
        )
    if skipped:
        caveats.append(
            Caveat(
                "io.unreadable-skipped",
                f"{skipped:,} files or directories could not be read and were skipped",
            )
        )
    if flags & os.O_NOATIME == 0:
        caveats.append(
            Caveat(
                "io.atime",
                "files owned by other users were read without O_NOATIME: their access "
                "times may change (contents and modification times do not)",
            )
        )
    return caveats


def _ranges(
    sizes: list[int], count: int, length: int, rng: random.Random
) -> list[tuple[int, int, int]]:
    """`count` distinct block-aligned ranges, files picked in proportion to their size."""
    picked: set[tuple[int, int]] = set()
    capacity = sum(max(1, s // max(length, BLOCK)) for s in sizes)
    want = min(count, capacity)
    tries = 0
    while len(picked) < want and tries < want * 20:
        tries += 1
        (i,) = rng.choices(range(len(sizes)), weights=sizes)
        last = max(0, sizes[i] - length)
        offset = rng.randrange(0, last + 1)
        picked.add((i, offset - offset % BLOCK))
    ranges = [(i, off, min(length, sizes[i] - off)) for i, off in sorted(picked)]
    rng.shuffle(ranges)  # shuffled order, as a shuffling loader asks for them
    return ranges
