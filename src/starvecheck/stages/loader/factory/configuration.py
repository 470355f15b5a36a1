"""One DataLoader configuration of the user's own pipeline, measured until its figure
is stable (`loader --factory`).

A configuration is (num_workers, prefetch_factor, persistent_workers, pin_memory) on
the user's dataset, sampler and collate_fn (stages/loader/factory/load.py). Each is read through a
fresh DataLoader, batch by batch, each batch within --batch-timeout (stages/dataloader/batches.py):

  first_batch_s   iter(loader) to the first batch: worker start-up and the first batch
  warm-up         the batches that drain the prefetch queue (1 + workers x prefetch);
                  then the memory is read, and as many batches again are read uncounted
                  (what the workers buffered while it was read): the clock starts on a
                  drained queue, so no batch made before a window is counted in it
  windows         then batches in windows (run.whole_window: long enough, the queue's
                  batches and more a worker, whole turns of the workers); samples/s and
                  batches/s per window. Reading stops once the last STABLE_WINDOWS
                  windows agree within STABLE_SPREAD of their median ("stable"), when the
                  time budget is spent ("budget": never before a first whole window, up
                  to OVERRUN times it; a window cut there is `partial`), or at the end of
                  the epoch ("epoch"); which one is recorded.
  CPU             user+system seconds of the main process and of every worker over the
                  windows (psutil), per sample; their seconds runnable but waiting for a
                  CPU (run queue, /proc/PID/task/*/schedstat), so that a wait for the CPU
                  is never read as I/O; the workers' seconds alive over the windows, of
                  which what is neither CPU nor run queue is blocked (I/O, sleep)
  machine         the CPU other processes used over the windows (/proc/stat less ours)
  memory          USS and PSS of the main process and each worker after the warm-up
                  and at the end: their growth is what copy-on-read costs
                  (pytorch/pytorch#13246)
  samples         a digest of every sample (inputs/fingerprints.py), warm-up included:
                  how many of those in the windows came again within their epoch; and
                  the batches each worker delivered (where the DataLoader tells which)
  restart_s       a later epoch's first batch (the start of every later epoch: new
                  workers, unless persistent), measured where the budget reads past one
                  epoch (with persistent_workers, a second iter() if it does not); the
                  windows run on across epochs, restarts included, as a training loop
                  pays them; where workers start every epoch, the figure is an epoch's
                  (epochs.py): its batches' pace with the restarts out, plus a restart

The processes' CPU, run queue and memory, and the machine's CPU, are read by
processes.py; a configuration too slow for windows, by slowread.py.
"""

from __future__ import annotations

import statistics
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.signals import check_signals
from starvecheck.core.status import UsageError
from starvecheck.inputs.fingerprints import Repeats
from starvecheck.stages.dataloader.batches import Batches
from starvecheck.stages.dataloader.deaths import watch
from starvecheck.stages.dataloader.workers import HURRY_GRACE_S, stop_workers
from starvecheck.stages.loader.factory.epochs import length, per_epoch, restart, starting
from starvecheck.stages.loader.factory.guard import next_batch, user_code
from starvecheck.stages.loader.factory.load import Pipeline
from starvecheck.stages.loader.factory.loaders import Built, Config, built_for, count_workers
from starvecheck.stages.loader.factory.owndata import batch_figures, to_device
from starvecheck.stages.loader.factory.processes import Processes
from starvecheck.stages.loader.factory.procs import worker_pids
from starvecheck.stages.loader.factory.run import OVERRUN, Budget, Run, stable, whole_window
from starvecheck.stages.loader.factory.slowread import MadeReading
from starvecheck.stages.loader.factory.stagesplit import Split


def measure(pipeline: Pipeline, config: Config, budget: Budget, device: Any = None) -> Run:
    """Read `config` until stable or out of budget, epoch after epoch where the dataset
    is shorter than that. The warm-up (the batches that fill the prefetch queue) goes
    on into the next epoch where one is shorter; after it, every batch counts, each
    later epoch's first batch with its restart (also recorded apart, `restart_s`)."""
    run = Run(config)
    watch()  # the OOM kills so far: a worker's death is named by their rise
    with starting(pipeline, config), user_code():  # a __len__ that raises now, say
        built = built_for(pipeline, config)
    warmup = 1 + config.workers * (config.prefetch_factor or 2) if config.workers else 1
    reading = _Reading(run, pipeline, budget, device, clocks.perf_counter())
    reading.split = Split(built.inner)  # each batch's wait by stage (stagesplit.py)
    epochs = 0
    try:
        while not run.stopped:
            epochs += 1
            reading.epoch(built, warmup, first=epochs == 1)
            if run.stopped:
                break
            if reading.spent(clocks.perf_counter()):
                run.stopped = "budget"
            elif epochs >= MAX_EPOCHS or (epochs >= 3 and run.batches == 0 and reading.empty):
                run.stopped = "epochs"  # epochs that deliver nothing after the first
        if config.workers and config.persistent_workers and not run.restarts_s:
            with starting(pipeline, config), user_code():
                run.restart_s = restart(built, budget, pipeline.describe())
    finally:
        # Persistent workers outlive each epoch's iterator: stopped here, on every way out
        # (a slow configuration's mid-batch, as Batches.hurry says).
        held = getattr(built.inner, "_iterator", None)
        stop_workers(held, stuck=reading.slow, grace_s=HURRY_GRACE_S)
        built.stop()
        reading.split.release()
    run.split = reading.split.run
    if run.restarts_s:
        run.restart_s = statistics.median(run.restarts_s)
    run.epochs = epochs
    reading.finish()
    return run


# The processes' CPU is read at least this often within a window.
CPU_EVERY_S = 0.1
# Their memory (USS and PSS: a walk of each process's pages, 20-50 ms for three of 200
# MB) at most this often, at a window's close and an epoch's end: read at every close it
# took 11% of the training process's time with 2 workers on 2 CPUs, which they lost.
MEMORY_EVERY_S = 1.0

# Epochs read at most for one configuration (a dataset of a few batches).
MAX_EPOCHS = 1000


class _Reading(MadeReading):
    """The windows of one configuration across its epochs, and the processes' CPU and
    memory, read after each window (processes.py)."""

    def __init__(self, run: Run, pipeline: Pipeline, budget: Budget, device: Any, t0: float):
        self.run, self.pipeline, self.budget, self.device = run, pipeline, budget, device
        self.started = t0
        self.clock = clocks.perf_counter
        self.processes = Processes(self.clock)  # their CPU and memory (processes.py)
        self.window_start = 0.0
        self.window_samples = 0
        self.window_batches = 0
        self.read_s = 0.0
        self.paused = 0.0  # when the last epoch ended
        self.windowing = False  # the warm-up is over: batches count in windows
        self.started_windows = 0.0
        self.warmed = 0  # warm-up batches read so far, across epochs
        self.empty = False  # the last epoch delivered no batch
        self.memory_read = False  # after the warm-up, before the drain
        self.cpu_read = 0.0  # when the processes' CPU was last read
        self.memory_at = 0.0  # and their memory, at a window's close
        self.drained = 0  # batches read since, uncounted, across epochs
        self.repeats = Repeats()
        self.split: Split  # set by measure()
        self.slow = False  # read by when its batches were made (made.py), not windows
        self.built: Built  # this configuration's loader, set each epoch
        self.window_own = 0.0  # the digest's time in this window (`_own`)
        # Each restart inside the windows: from the last batch counted before it to the
        # epoch's first batch (workers stopped, started, their first batch): epochs.py.
        self.gaps: list[float] = []
        self.last_got = 0.0  # when the last batch counted arrived
        self.between, self.ours_s = 0.0, 0.0  # our reading at an epoch's end; in windows
        self.epoch_batches: int | None = None  # an epoch's batches, where one ended

    def spent(self, now: float) -> bool:
        """The budget is spent: its seconds are, and a whole window was read (or, for a
        dataset too slow for one, OVERRUN times its seconds are)."""
        elapsed = now - self.started
        if self.run.samples_per_s:
            return elapsed >= self.budget.seconds
        return elapsed >= self.budget.seconds * OVERRUN

    def epoch(self, built: Built, warmup: int, first: bool) -> None:
        keep = self.run.config.workers > 0 and self.run.config.persistent_workers
        self.built = built
        self.split.epoch()
        try:
            self._epoch(built, warmup, first)
        finally:
            self.split.epoch_over()
            if not keep:
                built.stop()  # a DataLoader inside the user's object: its workers, now

    def _epoch(self, built: Built, warmup: int, first: bool) -> None:
        run, clock = self.run, self.clock
        what = self.pipeline.describe()
        t0 = clock()
        keep = run.config.workers > 0 and run.config.persistent_workers
        limit, workers = self.budget.batch_timeout_s, run.config.workers
        with (
            starting(self.pipeline, run.config),
            Batches(built.loader, limit, "loader", what, keep=keep, workers=workers) as it,
        ):
            self.repeats.new_epoch()
            count_workers(built.iterator(it), run.worker_batches)
            batch = self._next(it, 0, since=t0)  # its wait: the epoch's start-up with it
            self.empty = batch is None
            if batch is None and first:
                raise UsageError(
                    f"loader --factory {self.pipeline.spec.text}: {run.config.describe()}: "
                    "an epoch without a single batch (an empty dataset, or drop_last with "
                    "fewer samples than a batch): there is nothing to measure"
                )
            if first:
                run.first_batch_s = clock() - t0
                self.slow = self._too_slow()
            elif batch is not None:
                self._restarted(batch, t0)
            if self.slow and batch is not None:  # read by when its batches were made
                self._made(it, batch, built)
                return
            index = 1
            if batch is not None and not self.windowing:
                self.warmed += 1
                self._seen(batch)
            while batch is not None and not self.windowing and self.warmed < warmup:
                check_signals()  # the warm-up: the batches that fill the prefetch queue
                batch = self._next(it, index)
                index += 1
                self.warmed += batch is not None
                if batch is not None:
                    self._seen(batch)
            if batch is None:
                return  # an epoch no longer than the warm-up: the next one is measured
            pids: list[int | None] = [None, *worker_pids(built.iterator(it))]
            if not self.windowing:
                # Memory read (slow: smaps), then what the workers buffered meanwhile
                # drained, then the CPU read (fast) and the clock: nothing buffered
                # before the window is counted in it.
                if not self.memory_read:
                    self.processes.memory(pids)
                    self.memory_read = True
                batch, index = self._drain(it, index, batch)
                if batch is None:
                    return
            self.processes.sample(pids, not self.windowing, memory=False)
            began = clock()
            if not self.windowing:
                self.window_start = began
                self.started_windows = began
                self.windowing = True
                self.split.windows_begin()
            # Later epochs: the window goes on across the epoch's end, its restart (new
            # workers, their first batches) in it, as a training loop pays it.
            while not run.stopped:
                check_signals()
                asked = clock()
                batch = self._next(it, index)
                got = clock()
                if batch is None:
                    break
                index += 1
                self._batch(batch, got - asked)
                self.last_got = got
                self._counted(pids)
                self._step()
            if batch is None:
                self.epoch_batches = index
            self._ended(pids)
            self.read_s += self.paused - began
            del batch

    def _ended(self, pids: list[int | None]) -> None:
        """The epoch over: the processes read, that time out of the next gap (ours)."""
        self.paused = self.clock()
        self._read(pids, self.paused)
        self.between = self.clock() - self.paused

    def _read(self, pids: list[int | None], now: float) -> None:
        """The processes read: their CPU, and their memory at most once a second."""
        memory = now - self.memory_at >= MEMORY_EVERY_S
        self.processes.sample(pids, False, memory=memory)
        self.memory_at = now if memory else self.memory_at

    def _restarted(self, batch: Any, t0: float) -> None:
        """A later epoch's first batch, `t0` its iter(): its restart recorded, and in the
        window where one is open, as a loop pays it (epochs.py)."""
        now = self.clock()
        self.run.restarts_s.append(now - t0)
        if self.windowing:
            self._batch(batch, now - t0)
            self.gaps.append(max(0.0, now - self.last_got - self.between))
            self.ours_s += min(self.between, now - self.last_got)
            self.last_got = now
            self._step()

    def _step(self) -> None:
        """With --step-ms (stepped.py), the step after a batch counted, as a sleep: a
        GPU's step leaves the CPUs free."""
        if self.budget.step_s > 0 and not self.run.stopped:
            clocks.sleep(self.budget.step_s)

    def _next(self, it: Any, index: int, since: float | None = None) -> Any:
        """The next batch via the split's tap (None at the end), waited from `since`."""
        asked = self.split.before(self.built.iterator(it))
        asked = asked if since is None else (since, *asked[1:])
        batch = _next(it, self.pipeline, index)
        if batch is not None:
            self.split.after(asked)
        return batch

    def _counted(self, pids: list[int | None]) -> None:
        """After a batch counted: the window closed where it is whole, the processes read,
        and the reading stopped where stable or out of budget."""
        run, now = self.run, self.clock()
        if whole_window(self.window_batches, now - self.window_start - self._own(), run.config):
            self._window(now)
            self._read(pids, now)
            self.cpu_read = now
            if self.budget.until_stable and stable(run.samples_per_s):
                run.stopped = "stable"
        elif now - self.cpu_read >= CPU_EVERY_S:
            # Workers exit at an epoch's end: their last (cheap) reading stands.
            self.processes.sample(pids, False, memory=False)
            self.cpu_read = now
        if self.spent(now):
            run.stopped = run.stopped or "budget"

    def _drain(self, it: Any, index: int, batch: Any) -> tuple[Any, int]:
        """Read, uncounted, the batches the prefetch queue can hold (num_workers x
        prefetch_factor) and one more, which the window starts after (across epochs,
        where one is shorter); (that batch, the next index), or (None, _) at the end of
        the epoch."""
        config = self.run.config
        while self.drained < config.workers * (config.prefetch_factor or 2) + 1:
            check_signals()
            batch = self._next(it, index)
            if batch is None:
                return None, index
            index += 1
            self.drained += 1
            self._seen(batch)
        return batch, index

    def _batch(self, batch: Any, wait_s: float) -> None:
        run = self.run
        if self.device is not None:
            import torch

            t0 = self.clock()
            to_device(batch, self.device)
            torch.cuda.synchronize(self.device)
            run.copy_s.append(self.clock() - t0)
        started = self.clock()
        n, nbytes = batch_figures(batch, self.pipeline.settings.get("batch_size"))
        self.repeats.add(batch, n)
        own = self.clock() - started
        self.window_own += own
        run.digest_s += own
        run.waits_ms.append(wait_s * 1e3)
        run.batch_bytes.append(nbytes)
        run.samples += n
        run.batches += 1
        self.window_samples += n
        self.window_batches += 1

    def _seen(self, batch: Any) -> None:
        """A warm-up batch: its samples are in the epoch, not counted."""
        self.repeats.add(batch, self._samples_of(batch), count=False)

    def _own(self) -> float:
        """starvecheck's own time in this window that is not the pipeline's: the
        digest and the batch's figures, which the main process computes between
        batches. With num_workers=0 it delays the next batch by as much, and is taken
        out of the window; with workers, the workers go on loading meanwhile (as they
        do during a training step), so the window keeps it, bounded (benchmarks/
        digest_cost.py)."""
        return self.window_own if not self.run.config.workers else 0.0

    def _window(self, now: float) -> None:
        span = max(now - self.window_start - self._own(), 1e-9)
        self.window_own = 0.0
        self.run.samples_per_s.append(self.window_samples / span)
        self.run.batches_per_s.append(self.window_batches / span)
        self.run.window_s += span
        self.run.window_samples += self.window_samples
        self.run.window_batches += self.window_batches
        self.window_start, self.window_samples, self.window_batches = now, 0, 0

    def finish(self) -> None:
        run = self.run
        if self.slow:
            self._made_rate()
        elif self.window_batches and not run.samples_per_s:  # all of it shorter than a window
            self._window(self.paused)
            run.partial = True
        if not self.slow:
            per_epoch(run, self.gaps, self.epoch_batches or length(self.built), self.ours_s)
        run.seconds = self.read_s
        run.fingerprinted = self.repeats.read
        run.repeats = self.repeats.repeats
        run.unreadable = self.repeats.unreadable
        run.digest_skipped = dict(self.repeats.skipped)
        self.processes.figures(run, self.started_windows)


def _next(it: Any, pipeline: Pipeline, index: int) -> Any:
    """The next batch; None at the end of the epoch (guard.next_batch)."""
    return next_batch(it, f"loader --factory {pipeline.spec.text}", index)
