"""What handing a batch from a DataLoader worker to the training process costs, measured
on this machine: a worker writes each batch into shared memory (default_collate makes
its output there), the training process receives it (a file descriptor, a mapping) and
reads it, then frees it. None of that happens at num_workers=0, so a loop that loads in
its own process cannot show it; `measure(nbytes)` runs a DataLoader with one worker that
sends batches of that size and times both sides against the same work done in one
process. Large float batches (32 x 3 x 224 x 224 is 19 MB) can cost more to hand over
than the decode a worker saves.

Torch is imported here only (the caller has it loaded already: a loop over a DataLoader).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starvecheck.core import clocks

BATCHES = 10  # timed batches, after WARMUP
WARMUP = 2
LIMIT_S = 10.0  # the whole measurement gives up past this (a worker that never starts)
# Measured for batches of any size: a batch's trip through the DataLoader's queues (the
# queue, the pickle, the next index sent) costs about a millisecond on each side here
# whatever its size, 5-10% of a 20 ms step, which a forecast that leaves it out
# promises (benchmarks/stage_split.py: +13-16% before it was counted).
MIN_BYTES = 0


@dataclass(frozen=True)
class Handover:
    """Milliseconds per batch of `nbytes`, over the same work done in one process."""

    nbytes: int
    worker_ms: float  # CPU the worker spends more: shared memory, sending
    main_ms: float  # time the training process spends more: receiving, first reads, freeing
    batches: int
    # A worker's start in this process, ms: from making the iterator (its start method
    # the default context's, this process's copy or pickle) to its first batch, less the
    # batch's making; None: not read. What each worker a loop at num_workers=0 adds
    # costs every later pass, where workers are not kept.
    start_ms: float | None = None


WAITING = 0.05  # a loop that waits less than this share of its steps: not measured


def worth_measuring(nbytes: int, waits: Sequence[float], computes: Sequence[float]) -> bool:
    """Whether the worker model could need the hand-over's cost: torch loaded, and a
    loop that waits for data."""
    if nbytes < MIN_BYTES or "torch" not in sys.modules:
        return False
    total = sum(waits[1:]) + sum(computes[1:])
    return total > 0 and sum(waits[1:]) / total >= WAITING


class _Batches:
    """A map-style dataset whose every item is a new batch of `nbytes`, written: in a
    worker straight into shared memory, as default_collate does there."""

    def __init__(self, nbytes: int, n: int) -> None:
        self.nbytes, self.n = nbytes, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch
        from torch.utils.data import get_worker_info

        if get_worker_info() is None:
            x = torch.empty(self.nbytes, dtype=torch.uint8)
        else:
            storage = torch.UntypedStorage._new_shared(self.nbytes)
            x = torch.empty(0, dtype=torch.uint8).set_(storage)
        return x.fill_(i & 0xFF)


def _read(x: Any, into: Any) -> None:
    """What a training step does with a batch at least once: read all of it, as the copy
    to the device does (from pageable memory, through a staging buffer)."""
    into.copy_(x)


def _on_cpu(pid: int) -> float | None:
    """The worker's seconds on a CPU, every thread's (its queue's feeder thread pickles
    and sends the batch): probe/load.on_cpu_seconds; None where it cannot be read."""
    from starvecheck.probe.load import on_cpu_seconds

    return on_cpu_seconds(pid)


def measure(nbytes: int, *, limit_s: float = LIMIT_S) -> Handover | None:
    """The hand-over's cost for batches of `nbytes`; None where it cannot be measured
    (no torch, no worker, past `limit_s`; worth_measuring says when it matters)."""
    try:
        import psutil
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        return None
    threads = torch.get_num_threads()
    clock = clocks.perf_counter
    try:
        n = WARMUP + BATCHES
        local = _Batches(nbytes, n)
        into = torch.empty(nbytes, dtype=torch.uint8)
        made, used = [], []
        for i in range(n):
            torch.set_num_threads(1)  # making a batch as a worker does: one thread
            t0 = clocks.thread_time()
            x = local[i]
            made.append(clocks.thread_time() - t0)
            torch.set_num_threads(threads)  # using it as the training process does
            t1 = clock()
            _read(x, into)
            del x
            used.append(clock() - t1)
        made, used = made[WARMUP:], used[WARMUP:]
        # The worker's batch is ready before the training process asks (a worker that
        # keeps up): what the training process spends is then its own.
        ahead = 2 * statistics.median(made) + 0.002
        loader = DataLoader(local, batch_size=None, num_workers=1, prefetch_factor=2)
        started = clocks.monotonic()
        it = iter(loader)
        try:
            pids = [p.pid for p in getattr(it, "_workers", ())]
            if len(pids) != 1:
                return None
            worker = psutil.Process(pids[0])
            received, on_cpu, cpu0, cpu1 = [], [], 0.0, 0.0
            first = None
            for i in range(n):
                if clocks.monotonic() - started > limit_s:
                    return None
                if i == WARMUP:
                    t = worker.cpu_times()
                    cpu0 = t.user + t.system
                if i:  # the first: as soon as the worker has started and sent it
                    clocks.sleep(ahead)
                on_cpu.append(_on_cpu(pids[0]))  # the worker idle, its batches made
                t0 = clock()
                x = next(it)
                if first is None:  # the worker started, and made and sent its batch
                    first = clocks.monotonic() - started
                _read(x, into)
                del x
                if i >= WARMUP:
                    received.append(clock() - t0)
            t = worker.cpu_times()
            cpu1 = t.user + t.system
        finally:
            del it
    except Exception:  # the measurement is ours: it never breaks the caller
        return None
    finally:
        torch.set_num_threads(threads)
    # Each next() sends the worker one more index, which it makes and sends while the
    # loop sleeps: between two readings, one batch. Their median leaves out a worker's
    # one-off work (a forked child of Lightning's process once took 250 ms of CPU more
    # than its batches, read as 25 ms a batch over 10; what it did was not traced, its
    # inherited heap's first collection most likely). Without schedstat: the ticks
    # between the two psutil readings (10 ms each), the same count of batches, shifted
    # by the prefetch.
    steps = [b - a for a, b in zip(on_cpu[WARMUP:], on_cpu[WARMUP + 1 :], strict=False)
             if a is not None and b is not None]  # fmt: skip
    per_batch = statistics.median(steps) if steps else (cpu1 - cpu0) / BATCHES
    worker_ms = per_batch * 1e3 - statistics.median(made) * 1e3
    main_ms = (statistics.median(received) - statistics.median(used)) * 1e3
    start = None if first is None else max(0.0, first - statistics.median(made)) * 1e3
    return Handover(nbytes, max(0.0, worker_ms), max(0.0, main_ms), BATCHES, start)
