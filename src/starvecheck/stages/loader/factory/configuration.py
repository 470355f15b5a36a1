"""One DataLoader configuration of the user's own pipeline, measured until its figure
is stable (`loader --factory`).

A configuration is (num_workers, prefetch_factor, persistent_workers, pin_memory) on
the user's dataset, sampler and collate_fn (stages/loader/factory/load.py). Each is read through a
fresh DataLoader, batch by batch, each batch within --batch-timeout (stages/dataloader/batches.py):

  first_batch_s   iter(loader) to the first batch: worker start-up and the first batch
  warm-up         the batches that drain the prefetch queue (1 + workers x prefetch)
  windows         then batches in windows of at least WINDOW_S seconds; samples/s and
                  batches/s per window. Reading stops once the last STABLE_WINDOWS
                  windows agree within STABLE_SPREAD of their median ("stable"), when
                  the time budget is spent ("budget"), or at the end of the epoch
                  ("epoch"); which one is recorded.
  CPU             user+system seconds of the main process and of every worker over the
                  windows (psutil), per sample
  memory          USS and PSS of the main process and each worker after the warm-up
                  and at the end: their growth is what copy-on-read costs
                  (pytorch/pytorch#13246)
  restart_s       a later epoch's first batch (the start of every later epoch: new
                  workers, unless persistent), measured where the budget reads past one
                  epoch (with persistent_workers, a second iter() if it does not); the
                  windows run on across epochs, restarts included, as a training loop
                  pays them
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starvecheck.core.signals import check_signals, importing
from starvecheck.core.status import UsageError
from starvecheck.stages.dataloader.batches import Batches
from starvecheck.stages.dataloader.workers import stop_workers
from starvecheck.stages.loader.factory.load import Pipeline, one_line
from starvecheck.stages.loader.factory.owndata import (
    ChainedInit,
    Named,
    SampleFailed,
    batch_figures,
    to_device,
    worker_error,
)

WINDOW_S = 0.25  # a window's least length
WINDOW_BATCHES = 2  # and least batches
STABLE_WINDOWS = 4
STABLE_SPREAD = 0.10  # (max - min) / median of the last windows


@dataclass(frozen=True)
class Config:
    workers: int
    prefetch_factor: int | None = None  # None: torch's default (2) where workers > 0
    persistent_workers: bool = False
    pin_memory: bool = False

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_workers": self.workers, "pin_memory": self.pin_memory}
        if self.workers:
            out["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                out["prefetch_factor"] = self.prefetch_factor
        return out

    def describe(self) -> str:
        parts = [f"num_workers={self.workers}"]
        if self.workers and self.prefetch_factor is not None:
            parts.append(f"prefetch_factor={self.prefetch_factor}")
        if self.workers and self.persistent_workers:
            parts.append("persistent_workers=True")
        if self.pin_memory:
            parts.append("pin_memory=True")
        return ", ".join(parts)


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

    @property
    def median_samples_per_s(self) -> float | None:
        return statistics.median(self.samples_per_s) if self.samples_per_s else None


def make_loader(pipeline: Pipeline, config: Config) -> Any:
    """A DataLoader on the user's dataset with the user's sampler, collate and other
    settings, and `config`'s num_workers, prefetch_factor, persistent_workers and
    pin_memory."""
    with importing():
        from torch.utils.data import DataLoader

    kwargs = {
        k: v
        for k, v in pipeline.settings.items()
        if k
        not in ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "timeout")
    }
    if kwargs.get("batch_sampler") is not None:
        for k in ("batch_size", "drop_last", "sampler"):
            kwargs.pop(k, None)
    kwargs["worker_init_fn"] = (
        ChainedInit(kwargs.get("worker_init_fn"))
        if config.workers
        else kwargs.get("worker_init_fn")
    )
    dataset = pipeline.dataset if pipeline.iterable else Named(pipeline.dataset)
    return DataLoader(dataset, **kwargs, **config.kwargs())


def _memory(pid: int | None = None) -> Memory:
    import psutil

    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.Error, OSError):
        return Memory(None, None)
    return Memory(float(getattr(info, "uss", 0)) or None, float(getattr(info, "pss", 0)) or None)


def _cpu(pid: int | None = None) -> float | None:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return None
    return float(t.user + t.system)


def _worker_pids(it: Any) -> list[int]:
    return [w.pid for w in getattr(it, "_workers", ()) if w.pid is not None]


@dataclass(frozen=True)
class Budget:
    seconds: float  # per configuration, windows included
    batch_timeout_s: float


def measure(pipeline: Pipeline, config: Config, budget: Budget, device: Any = None) -> Run:
    """Read `config` until stable or out of budget, epoch after epoch where the dataset
    is shorter than that. The warm-up (the batches that fill the prefetch queue) goes
    on into the next epoch where one is shorter; after it, every batch counts, each
    later epoch's first batch with its restart (also recorded apart, `restart_s`)."""
    run = Run(config)
    loader = _built(pipeline, config)
    warmup = 1 + config.workers * (config.prefetch_factor or 2) if config.workers else 1
    reading = _Reading(run, pipeline, budget, device, time.perf_counter())
    epochs = 0
    try:
        while not run.stopped:
            epochs += 1
            reading.epoch(loader, warmup, first=epochs == 1)
            if run.stopped:
                break
            if time.perf_counter() - reading.started >= budget.seconds:
                run.stopped = "budget"
            elif epochs >= MAX_EPOCHS or (epochs >= 3 and run.batches == 0):
                run.stopped = "epochs"  # a dataset of a batch or two an epoch
        if config.workers and config.persistent_workers and not run.restarts_s:
            run.restart_s = _restart(loader, budget, pipeline.describe())
    finally:
        # Persistent workers outlive each epoch's iterator: stopped here, on every way out.
        stop_workers(getattr(loader, "_iterator", None))
    if run.restarts_s:
        run.restart_s = statistics.median(run.restarts_s)
    run.epochs = epochs
    reading.finish()
    return run


# Epochs read at most for one configuration (a dataset of a few batches).
MAX_EPOCHS = 1000


class _Reading:
    """The windows of one configuration across its epochs, and the processes' CPU and
    memory, read after each window (workers exit at the end of an epoch: their last
    reading stands)."""

    def __init__(self, run: Run, pipeline: Pipeline, budget: Budget, device: Any, t0: float):
        self.run, self.pipeline, self.budget, self.device = run, pipeline, budget, device
        self.started = t0
        self.clock = time.perf_counter
        self.cpu0: dict[int | None, float] = {}  # pid (None: this process) -> at the start
        self.cpu1: dict[int | None, float] = {}  # -> latest
        self.mem0: dict[int | None, Memory] = {}
        self.mem1: dict[int | None, Memory] = {}
        self.window_start = 0.0
        self.window_samples = 0
        self.window_batches = 0
        self.read_s = 0.0
        self.paused = 0.0  # when the last epoch ended
        self.windowing = False  # the warm-up is over: batches count in windows
        self.warmed = 0  # warm-up batches read so far, across epochs

    def _sample(self, pids: list[int | None], first: bool) -> None:
        for pid in pids:
            cpu = _cpu(pid)
            if cpu is not None:
                if first or pid not in self.cpu0:
                    self.cpu0.setdefault(pid, cpu)
                self.cpu1[pid] = cpu
            mem = _memory(pid)
            if mem.uss is not None:
                self.mem0.setdefault(pid, mem)
                self.mem1[pid] = mem

    def epoch(self, loader: Any, warmup: int, first: bool) -> None:
        run, clock = self.run, self.clock
        what = self.pipeline.describe()
        t0 = clock()
        keep = run.config.workers > 0 and run.config.persistent_workers
        with (
            _starting(self.pipeline, run.config),
            Batches(loader, self.budget.batch_timeout_s, "loader", what, keep=keep) as it,
        ):
            batch = _next(it, self.pipeline, 0)
            if first:
                run.first_batch_s = clock() - t0
            elif batch is not None:
                run.restarts_s.append(clock() - t0)
                if self.windowing:  # in the window, its restart too, as a loop pays it
                    self._batch(batch, clock() - t0)
            index = 1
            if batch is not None and not self.windowing:
                self.warmed += 1
            while batch is not None and not self.windowing and self.warmed < warmup:
                check_signals()  # the warm-up: the batches that fill the prefetch queue
                batch = _next(it, self.pipeline, index)
                index += 1
                self.warmed += batch is not None
            if batch is None:
                return  # an epoch no longer than the warm-up: the next one is measured
            pids: list[int | None] = [None, *_worker_pids(getattr(it, "_it", None))]
            self._sample(pids, not self.windowing)
            began = clock()
            if not self.windowing:
                self.window_start = began
                self.windowing = True
            # Later epochs: the window goes on across the epoch's end, its restart (new
            # workers, their first batches) in it, as a training loop pays it.
            while not run.stopped:
                check_signals()
                asked = clock()
                batch = _next(it, self.pipeline, index)
                got = clock()
                if batch is None:
                    break
                index += 1
                self._batch(batch, got - asked)
                now = clock()
                if now - self.window_start >= WINDOW_S and self.window_batches >= WINDOW_BATCHES:
                    self._window(now)
                    self._sample(pids, False)
                    if stable(run.samples_per_s):
                        run.stopped = "stable"
                if now - self.started >= self.budget.seconds:
                    run.stopped = run.stopped or "budget"
            self.paused = clock()
            self._sample(pids, False)
            self.read_s += self.paused - began
            del batch

    def _batch(self, batch: Any, wait_s: float) -> None:
        run = self.run
        if self.device is not None:
            import torch

            t0 = self.clock()
            to_device(batch, self.device)
            torch.cuda.synchronize(self.device)
            run.copy_s.append(self.clock() - t0)
        n, nbytes = batch_figures(batch, self.pipeline.settings.get("batch_size"))
        run.waits_ms.append(wait_s * 1e3)
        run.batch_bytes.append(nbytes)
        run.samples += n
        run.batches += 1
        self.window_samples += n
        self.window_batches += 1

    def _window(self, now: float) -> None:
        span = max(now - self.window_start, 1e-9)
        self.run.samples_per_s.append(self.window_samples / span)
        self.run.batches_per_s.append(self.window_batches / span)
        self.window_start, self.window_samples, self.window_batches = now, 0, 0

    def finish(self) -> None:
        run = self.run
        if self.window_batches and not run.samples_per_s:  # all of it shorter than a window
            self._window(self.paused)
        run.seconds = self.read_s
        if None in self.cpu0 and None in self.cpu1:
            run.main_cpu_s = self.cpu1[None] - self.cpu0[None]
        workers = [p for p in self.cpu1 if p is not None and p in self.cpu0]
        run.worker_cpu_s = (
            sum(self.cpu1[p] - self.cpu0[p] for p in workers)
            if workers
            else (0.0 if not run.config.workers else None)
        )
        if None in self.mem0:
            run.main_memory = (self.mem0[None], self.mem1[None])
        run.worker_memory = [(self.mem0[p], self.mem1[p]) for p in self.mem0 if p is not None]


def _built(pipeline: Pipeline, config: Config) -> Any:
    try:
        return make_loader(pipeline, config)
    except (ValueError, TypeError) as e:
        raise UsageError(
            f"loader --factory {pipeline.spec.text}: DataLoader({config.describe()}) refused "
            f"the pipeline's settings: {one_line(e)}"
        ) from e


def _next(it: Any, pipeline: Pipeline, index: int) -> Any:
    """The next batch; None at the end of the epoch. A sample that raises (in this
    process or a worker) is one line naming the sample and the exception; anything else
    that fails (a collate_fn, a sampler) names the batch."""
    try:
        return next(it)
    except StopIteration:
        return None
    except UsageError:
        raise
    except Exception as e:
        where = "" if isinstance(e, SampleFailed) else f"batch {index}: "
        raise UsageError(f"loader --factory {pipeline.spec.text}: {where}{worker_error(e)}") from e


@contextlib.contextmanager
def _starting(pipeline: Pipeline, config: Config) -> Iterator[None]:
    """An error starting the workers (iter(loader): a dataset that cannot be pickled
    for a spawn or forkserver context, a worker_init_fn that raises) is one line."""
    try:
        yield
    except UsageError:
        raise
    except Exception as e:
        text = one_line(e)
        if "pickle" in text.lower():
            context = pipeline.settings.get("multiprocessing_context")
            how = f" ({getattr(context, '_name', context)})" if context else ""
            why = f"the dataset cannot be sent to worker processes{how}: {text}"
        else:
            why = worker_error(e)
        raise UsageError(
            f"loader --factory {pipeline.spec.text}: {config.describe()}: {why}"
        ) from e


def _restart(loader: Any, budget: Budget, what: str) -> float | None:
    """A second iter() on a persistent-workers DataLoader: its first batch."""
    started = time.perf_counter()
    with Batches(loader, budget.batch_timeout_s, "loader", what) as it:
        try:
            next(it)
        except StopIteration:
            return None
        return time.perf_counter() - started


def stable(
    values: list[float], windows: int = STABLE_WINDOWS, spread: float = STABLE_SPREAD
) -> bool:
    """The last `windows` figures agree within `spread` of their median."""
    if len(values) < windows:
        return False
    last = values[-windows:]
    mid = statistics.median(last)
    return mid > 0 and (max(last) - min(last)) / mid <= spread
