"""`starve`: does the input pipeline keep up with the GPU? A producer/consumer run.

Each sample costs D ms of real CPU work in a DataLoader worker (a busy loop that
counts this thread's CPU time, not wall time, so workers sharing a core really take
longer; or real tokenization with --tokenizer); batches of B go to a consumer that
takes G ms per step (a sleep, as a GPU step leaves the host CPU free). Per step,
after warm-up: the time blocked waiting for the batch and the compute time; the GPU
idle share is wait / (wait + compute).

Next to each measurement, two predictions of the steady-state wait:
  CPU-aware:   max(0, D*B / min(W, effective CPUs) - G)   (W = 0: D*B, all on the main process)
  sleep model: max(0, D*B / W - G)                        (what a sleep-based benchmark predicts)
so a person sees where adding workers stops helping on this machine.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from starvecheck.core.criteria import least_idle
from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.signals import check_signals, importing
from starvecheck.inputs.embedded import default_texts
from starvecheck.inputs.tokenizers import load_tokenizer
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S, Batches
from starvecheck.stages.dataloader.workers import prepare_workers, worker_init
from starvecheck.stages.options import StarveOptions, default_workers

if TYPE_CHECKING:
    from starvecheck.inputs.workload import Workload

Progress = Callable[[str, int, int], None]


def _no_progress(what: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True)
class Plan:
    sample_ms: float = StarveOptions.ASSUMED_SAMPLE_MS  # D
    batch_size: int = StarveOptions.batch_size  # B
    step_ms: float = StarveOptions.ASSUMED_STEP_MS  # G
    workers: tuple[int, ...] = (0, 1, 2, 4)
    steps: int = StarveOptions.STEPS[False]
    warmup_steps: int = StarveOptions.WARMUP_STEPS
    sleep: bool = False  # the sleep-based model: samples wait instead of working
    effective_cpus: int = 1
    tokenizer: str | None = None
    # doctor: after the sweep, measure the preprocessing capacity this many times
    # (0: not at all; the `starve` command does not).
    capacity_runs: int = 0
    # The inputs simulated with defaults rather than given ("sample_ms", "step_ms").
    assumed: tuple[str, ...] = ()

    def parameters(self) -> dict[str, Any]:
        return {
            "assumed": list(self.assumed),
            "sample_ms": self.sample_ms,
            "batch_size": self.batch_size,
            "step_ms": self.step_ms,
            "workers": list(self.workers),
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "work": "sleep" if self.sleep else ("tokenize" if self.tokenizer else "cpu"),
            "tokenizer": self.tokenizer,
            "effective_cpus": self.effective_cpus,
        }


def predicted_wait_ms(d_ms: float, b: int, g_ms: float, w: int, cpus: int) -> float:
    """Steady-state wait per step when W workers share `cpus` CPUs (CPU-bound work)."""
    if w == 0:
        return d_ms * b  # the main process makes every batch itself, between steps
    return max(0.0, d_ms * b / min(w, max(1, cpus)) - g_ms)


def sleep_model_wait_ms(d_ms: float, b: int, g_ms: float, w: int) -> float:
    """The same, if samples only waited (I/O, sleep): workers never compete for CPUs."""
    if w == 0:
        return d_ms * b
    return max(0.0, d_ms * b / w - g_ms)


def burn_cpu(ms: float) -> None:
    """Busy-loop until this thread has used `ms` of CPU time. CPU time, not wall
    time: a worker that shares its core with another needs twice the wall time."""
    end = time.thread_time() + ms / 1000
    x = 0
    while time.thread_time() < end:
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
            time.sleep(self.sample_ms / 1000)
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


def measure_point(
    dataset: _Samples,
    plan: Plan,
    workers: int,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
    d_ms: float | None = None,
) -> Point:
    """One worker count: the first batch, warm-up steps, then the measured steps, each
    batch within `batch_timeout_s` plus its simulated work (0: no limit)."""
    with importing():
        import torch

    point = Point(workers)
    clock = time.perf_counter
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
                time.sleep(plan.step_ms / 1000)  # the GPU step: the host CPU is free meanwhile
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
        t0 = time.thread_time()
        tokenizer(texts[i], truncation=True, max_length=512)
        costs.append((time.thread_time() - t0) * 1000)
    return statistics.median(costs)


def sweep(
    plan: Plan,
    progress: Progress = _no_progress,
    tokenizer: Any = None,
    texts: Sequence[str] | None = None,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
    d_ms: float | None = None,
) -> list[Point]:
    most = max(plan.workers, default=0)
    n = (plan.steps + warmup_steps(plan, most) + 2 + most * PREFETCH) * plan.batch_size
    dataset = _Samples(n, plan.sample_ms, plan.sleep, texts, tokenizer)
    points = []
    for i, w in enumerate(plan.workers):
        progress(f"{w} worker(s)", i, len(plan.workers))
        points.append(measure_point(dataset, plan, w, batch_timeout_s, d_ms))
    progress("done", len(plan.workers), len(plan.workers))
    return points


def summarize(plan: Plan, d_ms: float, points: Sequence[Point]) -> list[Metric]:
    """Metrics named as the README promises (wait_ms.w<N>, predicted_wait_ms.w<N>, ...),
    each labelled with its quantity and worker count."""
    metrics: list[Metric] = [
        Metric.single("sample_cpu_ms", round(d_ms, 4), "ms", {"quantity": "sample_cpu_ms"})
    ]
    for p in points:
        w = p.workers

        def at(quantity: str) -> dict[str, Any]:
            return {"quantity": quantity, "workers": w}  # noqa: B023 (used at once)

        predicted = predicted_wait_ms(d_ms, plan.batch_size, plan.step_ms, w, plan.effective_cpus)
        naive = sleep_model_wait_ms(d_ms, plan.batch_size, plan.step_ms, w)
        metrics += [
            _mean_metric(f"wait_ms.w{w}", p.waits_ms, "ms", at("wait_ms")),
            Metric.single(
                f"predicted_wait_ms.w{w}", round(predicted, 3), "ms", at("predicted_wait_ms")
            ),
            Metric.single(
                f"sleep_model_wait_ms.w{w}", round(naive, 3), "ms", at("sleep_model_wait_ms")
            ),
            _mean_metric(f"compute_ms.w{w}", p.computes_ms, "ms", at("compute_ms")),
            Metric.single(f"idle_share.w{w}", round(p.idle_share, 4), "fraction", at("idle_share")),
            Metric.single(
                f"first_batch_s.w{w}", round(p.first_batch_s, 4), "s", at("first_batch_s")
            ),
        ]
    return metrics


def _mean_metric(name: str, values: Sequence[float], unit: str, labels: dict[str, Any]) -> Metric:
    """Per-step figures headed by their mean, not their median: with W workers batches
    arrive in bursts (a long wait, then W-1 short ones), so the median wait can be 0
    while the GPU idles; the mean is what the idle share is made of."""
    m = Metric.repeated(name, values, unit, labels)
    return replace(m, value=statistics.fmean(values)) if values else m


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
    labels = {"quantity": "samples_per_s", "workers": workers}
    return Metric.repeated(f"capacity.w{workers}", rates, "samples/s", labels)


def run(
    plan: Plan,
    progress: Progress = _no_progress,
    warn: Callable[[str], None] = lambda m: None,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> StageResult:
    from starvecheck.core.signals import signals_raise
    from starvecheck.stages.dataloader import preflight

    # A sample is a small tensor of token ids (or nothing, with --sleep): a batch is tiny.
    plan = preflight.fitted(plan, plan.batch_size * 4096, PREFETCH, warn)
    start = time.perf_counter()
    caveats: list[Caveat] = []
    tokenizer = texts = None
    d_ms = plan.sample_ms
    if plan.tokenizer:
        tokenizer = load_tokenizer(plan.tokenizer)
        texts = default_texts(256)
        d_ms = calibrate_tokenizer_ms(tokenizer, texts)
        caveats.append(
            Caveat(
                "starve.tokenizer",
                f"each sample is real tokenization of ~2,000 characters of English (standard "
                f"library docstrings) by {plan.tokenizer}: {d_ms:.3f} ms of CPU per sample, "
                "measured here; --sample-ms does not apply",
            )
        )
    if plan.sleep:
        caveats.append(
            Caveat(
                "starve.sleep",
                "--sleep: samples sleep instead of working, so workers never compete for "
                "CPUs; the sleep model's predictions hold, and real preprocessing will not "
                "match them",
            )
        )
    capacity = None
    extra: dict[str, Any] = {}
    with signals_raise():  # SIGTERM ends the sweep like Ctrl-C: workers are shut down
        points = sweep(plan, progress, tokenizer, texts, batch_timeout_s, d_ms)
        if plan.capacity_runs:
            w = capacity_workers(points, plan.effective_cpus)
            n = (plan.steps + warmup_steps(plan, w) + 2 + w * PREFETCH) * plan.batch_size
            dataset = _Samples(n, plan.sample_ms, plan.sleep, texts, tokenizer)
            capacity = measure_capacity(
                dataset, plan, w, plan.capacity_runs, progress, batch_timeout_s, d_ms
            )
            extra = {"capacity_workers": w, "capacity_runs": plan.capacity_runs}
    metrics = summarize(plan, d_ms, points)
    with importing():
        import torch

    params = {
        **plan.parameters(),
        "sample_cpu_ms": round(d_ms, 4),
        "cuda": bool(torch.cuda.is_available()),
        **extra,
    }
    return StageResult(
        stage="starve",
        parameters=params,
        metrics=tuple(metrics),
        caveats=tuple(caveats),
        capacity=capacity,
        duration_s=round(time.perf_counter() - start, 3),
    )


# doctor: 4 measured steps with --quick, 20 without; the capacity from 3 runs.
DOCTOR_STEPS = {True: 4, False: 20}
CAPACITY_RUNS = 3


class StarveStage(BaseStage[StarveOptions, Plan]):
    """`starve` in the registry (stages/base.Stage)."""

    name = "starve"

    def plan(self, options: StarveOptions, ctx: RunContext) -> Plan:
        from starvecheck.core.status import UsageError

        if options.sleep and options.tokenizer:
            raise UsageError("--sleep and --tokenizer: choose one kind of work per sample")
        # What the user did not give is simulated with defaults, and said so: findings
        # on it are hints about a made-up workload, never a verdict on theirs.
        sample_unknown = options.sample_ms is None and not options.tokenizer
        assumed = (("sample_ms",) if sample_unknown else ()) + (
            ("step_ms",) if options.step_ms is None else ()
        )
        return Plan(
            sample_ms=StarveOptions.ASSUMED_SAMPLE_MS
            if options.sample_ms is None
            else options.sample_ms,
            batch_size=options.batch_size,
            step_ms=StarveOptions.ASSUMED_STEP_MS if options.step_ms is None else options.step_ms,
            assumed=assumed,
            workers=options.workers or default_workers(ctx.effective_cpus),
            steps=options.steps or StarveOptions.STEPS[options.quick],
            warmup_steps=StarveOptions.WARMUP_STEPS,
            sleep=options.sleep,
            effective_cpus=ctx.effective_cpus,
            tokenizer=options.tokenizer,
        )

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> Plan:
        eff = ctx.effective_cpus
        assert workload.step_ms is not None
        return Plan(
            sample_ms=workload.cpu_ms_per_sample,
            batch_size=workload.batch_size,
            step_ms=workload.step_ms,
            workers=(eff,) if quick else tuple(x for x in default_workers(eff) if x <= eff),
            steps=DOCTOR_STEPS[quick],
            warmup_steps=StarveOptions.WARMUP_STEPS,
            effective_cpus=eff,
            # A cpu_ms_per_sample that was given is the job's whole preprocessing (decode,
            # augment, tokenize): it stands; the tokenizer then serves pad's lengths only.
            tokenizer=workload.tokenizer if _cpu_measured(workload) else None,
            capacity_runs=CAPACITY_RUNS,
        )

    def measure(self, plan: Plan, ctx: RunContext) -> StageResult:
        return run(plan, ctx.progress, ctx.warn, ctx.batch_timeout_s)

    def measured_workload(self, workload: Workload, result: StageResult) -> Workload:
        """With a tokenizer (and no cpu_ms_per_sample given), the CPU per sample is
        measured, not given."""
        if not workload.tokenizer or not _cpu_measured(workload):
            return workload
        return workload.set("cpu_ms_per_sample", result.parameters["sample_cpu_ms"], "measured")


def _cpu_measured(workload: Workload) -> bool:
    """Whether starve measures the CPU per sample by tokenizing: only where the job's
    cpu_ms_per_sample was not given."""
    return workload.source("cpu_ms_per_sample") == "default"


STAGE = StarveStage()
