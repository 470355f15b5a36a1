"""`starve`'s producer/consumer run: a DataLoader whose samples cost real CPU (a busy
loop on this thread's CPU time, or a sleep, or real tokenization) feeding a consumer
that sleeps G ms per step, as a GPU step leaves the host CPU free. One run per worker
count (the sweep), each a fresh DataLoader, timed per step after warm-up; and
doctor's capacity runs, the same with a step of 0 ms.

Apart from the stage (stage.py), which makes figures of these points.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.criteria import least_idle
from starvecheck.core.metric import Metric
from starvecheck.core.schema.common import SAMPLES_PER_S
from starvecheck.core.signals import check_signals, importing
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S, Batches
from starvecheck.stages.dataloader.workers import prepare_workers, worker_init
from starvecheck.stages.starve.model import Plan

Progress = Callable[[str, int, int], None]


def _no_progress(what: str, done: int, total: int) -> None:
    pass


def burn_cpu(ms: float) -> None:
    """Busy-loop until this thread has used `ms` of CPU time. CPU time, not wall
    time: a worker that shares its core with another needs twice the wall time."""
    end = clocks.thread_time() + ms / 1000
    x = 0
    while clocks.thread_time() < end:
        for _ in range(100):
            x += 1


class _Samples:
    """A map-style dataset whose samples cost CPU (or sleep, or tokenization).
    Module level and plain, so DataLoader workers can receive it."""

    def __init__(
        self,
        n: int,
        sample_ms: float,
        sleep: bool,
        texts: Sequence[str] | None,
        tokenizer: Any = None,
    ) -> None:
        self.n = n
        self.sample_ms = sample_ms
        self.sleep = sleep
        self.texts = texts
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        if self.tokenizer is not None and self.texts:
            ids = self.tokenizer(self.texts[i % len(self.texts)], truncation=True, max_length=512)[
                "input_ids"
            ]
            out = torch.zeros(512, dtype=torch.long)
            out[: len(ids)] = torch.tensor(ids[:512], dtype=torch.long)
            return out
        if self.sleep:
            clocks.sleep(self.sample_ms / 1000)
        else:
            burn_cpu(self.sample_ms)
        return torch.full((64,), float(i))


@dataclass
class Point:
    """One worker count: raw per-step figures after warm-up."""

    workers: int
    waits_ms: list[float] = field(default_factory=list)
    computes_ms: list[float] = field(default_factory=list)
    first_batch_s: float = 0.0

    @property
    def idle_share(self) -> float:
        total = sum(self.waits_ms) + sum(self.computes_ms)
        return sum(self.waits_ms) / total if total > 0 else 0.0


PREFETCH = 2


def warmup_steps(plan: Plan, workers: int) -> int:
    """Steps to throw away before measuring. The workers' first batches queue up (up to
    W x prefetch_factor) while the main process waits for the first one, and the
    consumer eats that queue before the steady state shows; three times its length
    drains it whenever production is meaningfully slower than the step."""
    return max(plan.warmup_steps, 3 * workers * PREFETCH)


def work_s(plan: Plan, d_ms: float, workers: int) -> float:
    """Seconds one batch's simulated work takes at most, in the steady state and for the
    first batch: D*B, stretched where the workers outnumber the CPUs (busy loops share
    them; sleeps do not). It comes on top of --batch-timeout: a long --sample-ms is
    not a stuck loader."""
    share = 1.0 if plan.sleep or not workers else max(1.0, workers / max(1, plan.effective_cpus))
    return d_ms * plan.batch_size * share / 1e3


def samples(
    plan: Plan, workers: int, texts: Sequence[str] | None, tokenizer: Any = None
) -> _Samples:
    """A dataset with enough samples for one run at `workers`: the warm-up, the
    measured steps, the first batch and what the workers prefetch."""
    n = (plan.steps + warmup_steps(plan, workers) + 2 + workers * PREFETCH) * plan.batch_size
    return _Samples(n, plan.sample_ms, plan.sleep, texts, tokenizer)


def measure_point(
    dataset: _Samples,
    plan: Plan,
    workers: int,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
    d_ms: float | None = None,
) -> Point:
    """One worker count: the first batch, warm-up steps, then the measured steps, each
    batch within `batch_timeout_s` plus its simulated work (0: no limit)."""
    with importing("torch"):
        import torch

    point = Point(workers)
    clock = clocks.perf_counter
    with warnings.catch_warnings():
        # torch warns when workers exceed the CPUs; going past them is the point here.
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        if workers:
            prepare_workers()
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=plan.batch_size,
            num_workers=workers,
            shuffle=False,
            prefetch_factor=PREFETCH if workers else None,
            persistent_workers=False,
            worker_init_fn=worker_init if workers else None,
        )
        work = work_s(plan, plan.sample_ms if d_ms is None else d_ms, workers)
        timeout = batch_timeout_s + work if batch_timeout_s else 0.0
        with Batches(loader, timeout, "starve", _what(plan)) as it:
            start = clock()
            next(it)
            point.first_batch_s = clock() - start
            warmup = warmup_steps(plan, workers)
            for step in range(warmup + plan.steps):
                check_signals()  # an interrupt swallowed while forking workers
                t0 = clock()
                next(it)
                t1 = clock()
                clocks.sleep(plan.step_ms / 1000)  # the GPU step: the host CPU is free meanwhile
                t2 = clock()
                if step >= warmup:
                    point.waits_ms.append((t1 - t0) * 1000)
                    point.computes_ms.append((t2 - t1) * 1000)
    return point


def _what(plan: Plan) -> str:
    """The samples, as the error names them."""
    if plan.tokenizer:
        return f"samples tokenized by {plan.tokenizer}"
    return f"samples of {plan.sample_ms:g} ms {'sleep' if plan.sleep else 'CPU work'}"


def calibrate_tokenizer_ms(tokenizer: Any, texts: Sequence[str], n: int = 64) -> float:
    """Median CPU ms per sample of real tokenization, measured in this process."""
    costs = []
    for i in range(min(n, len(texts))):
        t0 = clocks.thread_time()
        tokenizer(texts[i], truncation=True, max_length=512)
        costs.append((clocks.thread_time() - t0) * 1000)
    return statistics.median(costs)


def sweep(
    plan: Plan,
    progress: Progress = _no_progress,
    tokenizer: Any = None,
    texts: Sequence[str] | None = None,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
    d_ms: float | None = None,
) -> list[Point]:
    dataset = samples(plan, max(plan.workers, default=0), texts, tokenizer)
    points = []
    for i, w in enumerate(plan.workers):
        progress(f"{w} worker(s)", i, len(plan.workers))
        points.append(measure_point(dataset, plan, w, batch_timeout_s, d_ms))
    progress("done", len(plan.workers), len(plan.workers))
    return points


def capacity_workers(points: Sequence[Point], effective_cpus: int) -> int:
    """Where doctor measures the capacity: the fewest workers that idle the GPU as
    little as the best at or below the CPUs (criteria.least_idle, the rule advice
    recommends by), else the most measured; at most the CPUs."""
    rec = least_idle({p.workers: p.idle_share for p in points}, effective_cpus)
    most = max((p.workers for p in points), default=0)
    return min(rec if rec is not None else most, max(1, effective_cpus))


def measure_capacity(
    dataset: _Samples,
    plan: Plan,
    workers: int,
    runs: int,
    progress: Progress = _no_progress,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
    d_ms: float | None = None,
) -> Metric:
    """Samples per second `workers` deliver when nothing waits for the consumer (the
    step takes 0 ms): the production rate of the preprocessing itself, which a run
    against a real step hides whenever the workers keep up. Each run is a fresh
    DataLoader; per run, batch_size x steps over the time spent waiting for them."""
    fast = replace(plan, step_ms=0.0)
    rates = []
    for i in range(runs):
        progress(f"capacity, {workers} worker(s)", i, runs)
        point = measure_point(dataset, fast, workers, batch_timeout_s, d_ms)
        spent_ms = sum(point.waits_ms) + sum(point.computes_ms)
        if spent_ms > 0:
            rates.append(plan.batch_size * len(point.waits_ms) * 1000 / spent_ms)
    labels = {"quantity": SAMPLES_PER_S, "workers": workers}
    return Metric.repeated(f"capacity.w{workers}", rates, "samples/s", labels)
