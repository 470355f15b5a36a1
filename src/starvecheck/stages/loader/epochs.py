"""`loader`'s epochs: each through a fresh torch DataLoader, when every batch arrived
and how long the loop blocked for it, over every (cache, layout, num_workers) point.

Apart from the stage (stage.py), which plans the sweep, writes or samples the data and
summarises these figures into metrics: what is measured here and what is said about it
change for different reasons.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from starvecheck.core import clocks
from starvecheck.core.signals import check_signals, importing, signals_held
from starvecheck.core.status import Unavailable
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S, Batches
from starvecheck.stages.dataloader.workers import prepare_workers, worker_init
from starvecheck.stages.samples import cache
from starvecheck.stages.samples.datasets import batch_size_of
from starvecheck.stages.samples.layouts import Progress
from starvecheck.stages.samples.plan import Plan
from starvecheck.stages.samples.reads import FileOps, timed_run
from starvecheck.stages.samples.residency import record_residency
from starvecheck.stages.samples.sources import Source

# Batches read in this process before measuring each layout (first-use costs).
WARMUP_BATCHES = 4


def _no_progress(what: str, done: int, total: int) -> None:
    pass


# --- the steady-state window (pure) ----------------------------------------------------


def steady(
    started: float, arrivals: Sequence[float], workers: int, prefetch: int
) -> tuple[int, float]:
    """The loader once running: (index of the first batch counted, seconds). Counting
    starts after the batch that empties the queue filled during start-up (1 + workers
    x prefetch batches) and ends at the last arrival. Short epochs keep at least their
    second half; a one-batch epoch counts from `started`."""
    n = len(arrivals)
    skip = max(0, min(1 + workers * prefetch, n // 2))
    if n == 0:
        return 0, 0.0
    return skip, arrivals[-1] - (arrivals[skip - 1] if skip else started)


# --- measuring -------------------------------------------------------------------------


@dataclass(frozen=True)
class Epoch:
    seconds: float  # steady state (see `steady`)
    steady_samples: int
    steady_bytes: int
    first_batch_s: float
    waits_s: tuple[float, ...]  # every batch after the first


@dataclass
class Measured:
    epochs: dict[tuple[str, str, int], list[Epoch]] = field(default_factory=dict)
    resident_cold: dict[str, list[float | None]] = field(default_factory=dict)
    resident_warm: dict[str, list[float | None]] = field(default_factory=dict)
    residency_errors: list[str] = field(default_factory=list)


def run_epoch(
    source: Source,
    plan: Plan,
    workers: int,
    pin_memory: bool,
    run: int,
    limit: int = 0,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Epoch:
    """One epoch (or `limit` batches) through a fresh DataLoader, each batch within
    `batch_timeout_s` (stages/dataloader/batches.py; 0: no limit). Workers are shut down and the
    dataset released on every way out, Ctrl-C and a stuck worker included."""
    with importing("torch"):
        import torch

    clock = clocks.perf_counter
    dataset = None
    try:
        with signals_held():  # the dataset exists only once it can be released
            dataset = source.make(run)
        if workers:
            prepare_workers()
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=plan.batch_size,
            shuffle=source.shuffle,
            num_workers=workers,
            collate_fn=source.collate,
            pin_memory=pin_memory,
            prefetch_factor=plan.prefetch_factor if workers else None,
            persistent_workers=False,
            worker_init_fn=worker_init if workers else None,
            generator=torch.Generator().manual_seed(plan.seed + run),
        )
        arrivals: list[float] = []
        waits: list[float] = []  # time blocked in next(it), every batch after the first
        counts: list[int] = []
        sizes: list[int] = []
        # The testing hook's delay (STARVECHECK_SLOW_RANKS) comes on top of the limit.
        delay_s = plan.batch_size * plan.sample_delay_ms / 1e3
        timeout = batch_timeout_s + delay_s if batch_timeout_s else 0.0
        started = clock()
        with Batches(loader, timeout, "loader", source.name) as it:
            while not limit or len(arrivals) < limit:
                check_signals()  # an interrupt swallowed while forking workers
                asked = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                arrivals.append(clock())
                if len(arrivals) > 1:
                    waits.append(arrivals[-1] - asked)
                n, nbytes = batch_size_of(batch)
                counts.append(n)
                sizes.append(nbytes)
    finally:
        if dataset is not None:
            with signals_held():
                source.release(dataset)
    skip, seconds = steady(started, arrivals, workers, plan.prefetch_factor)
    return Epoch(
        seconds=seconds,
        steady_samples=sum(counts[skip:]),
        steady_bytes=sum(sizes[skip:]),
        first_batch_s=(arrivals[0] - started) if arrivals else 0.0,
        waits_s=tuple(waits),
    )


def rotated(items: list[int], by: int) -> list[int]:
    """`items` turned by `by` places: round r starts at its r-th worker count."""
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


def measure(
    sources: Sequence[Source],
    plan: Plan,
    pin_memory: bool,
    progress: Progress = _no_progress,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Measured:
    """Every (cache, layout, num_workers): `plan.runs` epochs, each cold one evicted
    and checked first; warm ones after a full unmeasured read."""
    out = Measured()
    for source in sources:  # first-use costs (imports, code paths) out of the figures
        run_epoch(source, plan, 0, pin_memory, 0, WARMUP_BATCHES, batch_timeout_s)
    total = len(plan.temperatures) * len(sources) * len(plan.workers) * plan.runs
    warmed: set[str] = set()
    # Each (cache, layout)'s worker counts in rounds: run r reads every count once, in
    # an order turned by r, so counts compared are read side by side and a machine
    # whose other work comes and goes slows them alike (their ratio, run by run, holds).
    rounds = [
        (temp, source, run, workers)
        for temp in plan.temperatures
        for source in sources
        for run in range(plan.runs)
        for workers in rotated(list(plan.workers), run)
    ]
    for done, (temp, source, run, workers) in enumerate(rounds):
        layout = source.layout
        if temp == "warm" and layout.name not in warmed:
            files = FileOps(layout.paths, layout.dir_fd, layout.evict_flags)
            timed_run(files, threads=1, buffer_size=1 << 20, contiguous=True)
            out.resident_warm.setdefault(layout.name, []).append(
                record_residency(layout, out.residency_errors)
            )
            warmed.add(layout.name)
        epochs = out.epochs.setdefault((layout.name, temp, workers), [])
        if temp == "cold":
            cache.evict(
                layout.paths, dir_fd=layout.dir_fd, sync=layout.sync, flags=layout.evict_flags
            )
            out.resident_cold.setdefault(layout.name, []).append(
                record_residency(layout, out.residency_errors)
            )
        progress(f"{layout.name} {temp}, {workers} worker(s)", done, total)
        epochs.append(run_epoch(source, plan, workers, pin_memory, run, 0, batch_timeout_s))
    progress("measuring", total, total)
    return out


def measure_or_fail(
    sources: Sequence[Source], plan: Plan, pin: bool, progress: Progress, batch_timeout_s: float
) -> Measured:
    """`measure`, its failures said in one line: an I/O error (and the file it hit), a
    DataLoader whose worker died."""
    try:
        return measure(sources, plan, pin, progress, batch_timeout_s)
    except OSError as e:
        where = f" ({os.fsdecode(e.filename)})" if e.filename else ""
        raise Unavailable(f"I/O error during the measurement{where}: {e.strerror}") from e
    except RuntimeError as e:
        # torch reports a worker killed by a signal (out of memory, a bus error when
        # /dev/shm is full) as a RuntimeError: say so in one line.
        raise Unavailable(f"the DataLoader failed: {' '.join(str(e).split())}") from e
