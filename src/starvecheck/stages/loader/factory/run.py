"""One configuration's reading, as data: its windows' rules (how long a window is, and
when the figures are stable), its budget, and what was measured (`Run`). Reading it is
configuration.py's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from starvecheck.stages.loader.factory.loaders import Config

WINDOW_S = 0.25  # a window's least length
WINDOW_BATCHES = 2  # and least batches
WINDOW_PER_WORKER = 2  # and, past the prefetch queue's, least batches per worker
OVERRUN = 8.0  # the budget is stretched to this many times itself for a first window
STABLE_WINDOWS = 4
STABLE_SPREAD = 0.10  # (max - min) / median of the last windows


@dataclass
class Memory:
    uss: float | None  # bytes
    pss: float | None


@dataclass
class Run:
    """One configuration, measured."""

    config: Config
    first_batch_s: float = 0.0
    samples_per_s: list[float] = field(default_factory=list)  # per window
    batches_per_s: list[float] = field(default_factory=list)
    waits_ms: list[float] = field(default_factory=list)  # next() per batch, windows only
    samples: int = 0  # in the windows
    batches: int = 0
    batch_bytes: list[int] = field(default_factory=list)
    seconds: float = 0.0  # the windows' time
    stopped: str = ""  # stable, budget, epoch
    main_cpu_s: float | None = None  # over the windows
    worker_cpu_s: float | None = None
    main_memory: tuple[Memory, Memory] | None = None  # (after warm-up, at the end)
    worker_memory: list[tuple[Memory, Memory]] = field(default_factory=list)
    restart_s: float | None = None  # persistent workers: a later epoch's first batch
    restarts_s: list[float] = field(default_factory=list)  # later epochs' first batches
    epochs: int = 0
    copy_s: list[float] = field(default_factory=list)  # host-to-device per batch (CUDA)
    main_runq_s: float | None = None  # runnable, waiting for a CPU, over the windows
    worker_runq_s: float | None = None
    worker_alive_s: float | None = None  # the workers' wall time over the windows, summed
    others_cpus: float | None = None  # CPUs other processes kept busy over the windows
    window_s: float = 0.0  # the windows' time, epoch restarts inside them included
    window_samples: int = 0
    window_batches: int = 0
    main_span_s: float | None = None  # the time the main process's CPU was read over
    others_each: list[float | None] = field(default_factory=list)  # per slice, in rounds
    fingerprinted: int = 0  # samples in the windows with a digest
    repeats: int = 0  # of them, a sample already delivered in the same epoch
    unreadable: int = 0  # batches in the windows no digest could be made of
    digest_skipped: dict[str, int] = field(default_factory=dict)  # field, why -> batches
    digest_s: float = 0.0  # the digest's own time in the windows (fingerprints.py)
    worker_batches: dict[int, int] = field(default_factory=dict)  # worker id -> batches
    partial: bool = False  # its only window was cut short (fewer than least_batches)
    split: Any = None  # each batch's wait by stage of loading (stagesplit.RunSplit)
    made: bool = False  # its figures are from when its batches were made (made.py)

    @property
    def median_samples_per_s(self) -> float | None:
        return statistics.median(self.samples_per_s) if self.samples_per_s else None


def least_batches(config: Config) -> int:
    """The fewest batches a window holds: the prefetch queue's (num_workers x
    prefetch_factor) and WINDOW_PER_WORKER more a worker, so that a window is several
    batch times of every worker long, never a queue's worth read in a blink."""
    w = config.workers
    return max(WINDOW_BATCHES, w * ((config.prefetch_factor or 2) + WINDOW_PER_WORKER))


def whole_window(batches: int, seconds: float, config: Config) -> bool:
    """A window may close here: long enough, with enough batches, whole turns of the
    workers (they deliver in turn: a window of whole turns spans whole batch times)."""
    turn = max(1, config.workers)
    return seconds >= WINDOW_S and batches >= least_batches(config) and batches % turn == 0


@dataclass(frozen=True)
class Budget:
    seconds: float  # per configuration (per slice, in rounds), windows included
    batch_timeout_s: float
    until_stable: bool = True  # stop once the windows agree; False: read all `seconds`
    # A slow configuration (made.py): batches a worker made past the last one's first,
    # before its rate is read.
    intervals: int = 2
    # With --step-ms, the step after each batch counted, as a sleep (stepped.py): the
    # figures are then a training loop's. 0: loading alone.
    step_s: float = 0.0


def stable(
    values: list[float], windows: int = STABLE_WINDOWS, spread: float = STABLE_SPREAD
) -> bool:
    """The last `windows` figures agree within `spread` of their median."""
    if len(values) < windows:
        return False
    last = values[-windows:]
    mid = statistics.median(last)
    return mid > 0 and (max(last) - min(last)) / mid <= spread
