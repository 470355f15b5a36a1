"""A slow configuration's reading (made.py says why and how): the part of a
configuration's reading (configuration.py's `_Reading`) that reads it by when its
batches were made instead of in windows."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starvecheck.core import clocks
from starvecheck.core.signals import check_signals
from starvecheck.stages.loader.factory.made import too_slow
from starvecheck.stages.loader.factory.owndata import batch_figures
from starvecheck.stages.loader.factory.procs import worker_pids

if TYPE_CHECKING:
    from starvecheck.stages.loader.factory.load import Pipeline
    from starvecheck.stages.loader.factory.loaders import Built
    from starvecheck.stages.loader.factory.processes import Processes
    from starvecheck.stages.loader.factory.run import Budget, Run
    from starvecheck.stages.loader.factory.stagesplit import Split


class MadeReading:
    """Mixed into configuration.py's `_Reading`: what it needs of it is declared here."""

    run: Run
    pipeline: Pipeline
    budget: Budget
    split: Split
    clock: Callable[[], float] = clocks.perf_counter
    memory_read: bool
    started_windows: float
    paused: float
    read_s: float
    processes: Processes
    first_samples: int = 0  # the first batch's samples (a rate where it is all there is)

    if TYPE_CHECKING:  # _Reading's own

        def _seen(self, batch: Any) -> None: ...
        def _batch(self, batch: Any, wait_s: float) -> None: ...
        def _next(self, it: Any, index: int) -> Any: ...
        def spent(self, now: float) -> bool: ...

    def _too_slow(self) -> bool:
        """Windows would outlast the slice at the pace of the first batch's own work
        (made.py); only where the stage split's records say when batches were made."""
        work = self.split.run.when.first_work_s
        c = self.run.config
        return (
            self.split.tap is not None
            and work is not None
            and too_slow(work, c.workers, c.prefetch_factor, self.budget.seconds)
        )

    def _made(self, it: Any, batch: Any, built: Built) -> None:
        """A slow configuration's epoch: no drain, no window; batches read until every
        worker has made INTERVALS past the last one's first (or the budget, stretched
        OVERRUN times, is spent); the rate is read from when they were made (finish)."""
        run, clock, made = self.run, self.clock, self.split.run.when
        pids: list[int | None] = [None, *worker_pids(built.iterator(it))]
        if not self.memory_read:
            self.processes.memory(pids)
            self.memory_read = True
        self.processes.sample(pids, True, memory=False)
        began = clock()
        self.started_windows = self.started_windows or began
        self._seen(batch)
        self.first_samples = self._samples_of(batch)
        index = 1
        while not run.stopped:
            check_signals()
            if made.enough(run.config.workers, self.budget.intervals):
                run.stopped = "made"
            elif self.spent(clock()):
                run.stopped = "budget"
            if run.stopped:
                break
            asked = clock()
            batch = self._next(it, index)
            if batch is None:
                break  # the epoch ended: the next one goes on
            index += 1
            self._batch(batch, clock() - asked)
        self.paused = clock()
        self.processes.sample(pids, False)
        self.read_s += self.paused - began
        if run.stopped:  # the batches still in flight are not wanted
            it.hurry()

    def _samples_of(self, batch: Any) -> int:
        """A batch's samples (its leading size, else the batch size)."""
        return batch_figures(batch, self.pipeline.settings.get("batch_size"))[0]

    def _made_rate(self) -> None:
        """A slow configuration's figure: its batches made after every worker's first,
        over the time they span (made.py); partial where fewer than enough were made."""
        run = self.run
        got = self.split.run.when.rate(run.config.workers)
        if got is None:  # not one batch made past the firsts: the pace as read, cut short
            seconds, samples, batches = self.read_s, run.samples, run.batches
            if not batches:  # the first batch alone: its pace, start-up and all
                seconds, samples, batches = run.first_batch_s, self.first_samples, 1
                run.samples, run.batches = samples, batches
            if batches and seconds > 0 and samples:
                self.read_s = max(self.read_s, seconds)
                run.samples_per_s = [samples / seconds]
                run.batches_per_s = [batches / seconds]
                run.window_s, run.window_samples, run.window_batches = seconds, samples, batches
            run.partial = True
            return
        per_second, n, span = got
        per_batch = run.samples / run.batches if run.batches else 1.0
        run.samples_per_s, run.batches_per_s = [per_second * per_batch], [per_second]
        run.window_s, run.window_batches = span, n
        run.window_samples = round(n * per_batch)
        run.partial = not self.split.run.when.enough(run.config.workers, self.budget.intervals)
        run.made = True
