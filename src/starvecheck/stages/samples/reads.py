"""Timed reads: the inner loops of `io`, one per access pattern, and the runner that
spreads them over threads.

Each loop does what a data loader does per sample and nothing else: open, read
into a preallocated buffer, close (one file per sample), or `pread` at an offset
(a shard). `os.preadv` and `os.readv` fill a buffer without allocating, and
release the GIL, so reader threads overlap their waits as DataLoader workers do.
Latency is taken per sample with `perf_counter_ns`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starvecheck.core import clocks

READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC


@dataclass(frozen=True)
class FileOps:
    """Whole files, each opened, read to the end and closed."""

    names: Sequence[str]  # relative to dir_fd, or absolute when dir_fd is None
    dir_fd: int | None = None
    flags: int = READ_FLAGS

    def __len__(self) -> int:
        return len(self.names)

    def part(self, i: int, n: int, contiguous: bool) -> FileOps:
        return FileOps(_split(self.names, i, n, contiguous), self.dir_fd, self.flags)


@dataclass(frozen=True)
class RangeOps:
    """Byte ranges of a few large files, read with pread at their offsets."""

    ranges: Sequence[tuple[int, int, int]]  # (file index, offset, length)
    files: Sequence[str]
    dir_fd: int | None = None
    flags: int = READ_FLAGS

    def __len__(self) -> int:
        return len(self.ranges)

    def part(self, i: int, n: int, contiguous: bool) -> RangeOps:
        return RangeOps(_split(self.ranges, i, n, contiguous), self.files, self.dir_fd, self.flags)


Ops = FileOps | RangeOps


def _split(items: Sequence, i: int, n: int, contiguous: bool) -> Sequence:
    """Thread i's share: a contiguous slice (n sequential streams) or every n-th item
    (n readers sharing one shuffled order)."""
    if contiguous:
        size = len(items)
        return items[i * size // n : (i + 1) * size // n]
    return items[i::n]


@dataclass(frozen=True)
class RunResult:
    seconds: float
    bytes: int
    ops: int
    latencies_ns: list[int]


class ReadError(Exception):
    """A read failed mid-run (a file vanished, EIO); carries the path."""


def read_files(ops: FileOps, buf: bytearray, stop: threading.Event, lat: list[int]) -> int:
    total = 0
    view = [buf]
    clock = clocks.perf_counter_ns
    for name in ops.names:
        if stop.is_set():
            break
        t0 = clock()
        try:
            fd = os.open(name, ops.flags, dir_fd=ops.dir_fd)
        except OSError as e:
            raise ReadError(f"{os.fsdecode(name)}: {e.strerror}") from e
        try:
            while True:
                n = os.readv(fd, view)
                if n == 0:
                    break
                total += n
        finally:
            os.close(fd)
        lat.append(clock() - t0)
    return total


def read_ranges(ops: RangeOps, buf: bytearray, stop: threading.Event, lat: list[int]) -> int:
    total = 0
    fds: dict[int, int] = {}  # each reader opens its own descriptors: readahead state is
    clock = clocks.perf_counter_ns  # per open file, and shared ones would mix the streams
    mv = memoryview(buf)
    try:
        for index, offset, length in ops.ranges:
            if stop.is_set():
                break
            t0 = clock()
            fd = fds.get(index)
            if fd is None:
                try:
                    fd = fds[index] = os.open(ops.files[index], ops.flags, dir_fd=ops.dir_fd)
                except OSError as e:
                    raise ReadError(f"{os.fsdecode(ops.files[index])}: {e.strerror}") from e
            got = 0
            while got < length:
                n = os.preadv(fd, [mv[: length - got]], offset + got)
                if n == 0:
                    break  # the file shrank under us; count what was read
                got += n
            total += got
            lat.append(clock() - t0)
    finally:
        for fd in fds.values():
            os.close(fd)
    return total


def _reader(ops: Ops) -> Callable[[Ops, bytearray, threading.Event, list[int]], int]:
    return read_files if isinstance(ops, FileOps) else read_ranges  # type: ignore[return-value]


def timed_run(
    ops: Ops,
    *,
    threads: int,
    buffer_size: int,
    contiguous: bool,
    clock: Callable[[], float] = clocks.perf_counter,
) -> RunResult:
    """Read every op once with `threads` readers; wall time from the first read to the
    last. One thread runs in the calling thread (no hand-off, as fio's psync job)."""
    read = _reader(ops)
    if threads <= 1:
        lat: list[int] = []
        stop = threading.Event()
        buf = bytearray(buffer_size)
        start = clock()
        nbytes = read(ops, buf, stop, lat)
        return RunResult(clock() - start, nbytes, len(lat), lat)

    stop = threading.Event()
    gate = threading.Barrier(threads + 1)
    lats: list[list[int]] = [[] for _ in range(threads)]
    totals = [0] * threads
    errors: list[BaseException] = []

    def work(i: int) -> None:
        part = ops.part(i, threads, contiguous)
        buf = bytearray(buffer_size)
        try:
            gate.wait()
            totals[i] = read(part, buf, stop, lats[i])
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:  # handed to the main thread, which raises it
            errors.append(e)
            stop.set()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    try:
        gate.wait()
        start = clock()
        for w in workers:
            w.join()
        elapsed = clock() - start
    except BaseException:
        # Ctrl-C or SIGTERM in the main thread: stop the readers (each checks between
        # samples) and wait for them, so no read is still running during cleanup.
        stop.set()
        gate.abort()
        for w in workers:
            w.join()
        raise
    if errors:
        raise errors[0]
    all_lat = [x for part in lats for x in part]
    return RunResult(elapsed, sum(totals), len(all_lat), all_lat)
