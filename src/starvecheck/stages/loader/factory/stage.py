"""`loader --factory`: the user's own pipeline swept over DataLoader settings.

Configurations, in this order, each measured by stages/loader/factory/configuration.py until stable:
  1. the current one: the user's DataLoader as returned (num_workers, prefetch_factor,
     persistent_workers, pin_memory), or num_workers=0 for a bare Dataset;
  2. num_workers swept (--workers, or 0, 1, 2, 4, ... as `loader` sweeps), the rest
     as the current configuration has it;
  3. at the knee of that sweep (criteria.knee: the fewest workers within 5% of the best
     at or below the effective CPUs, the rule the recommendation uses, here only to
     decide where to measure more): prefetch_factor 4
     against the current one, persistent_workers=True where it is off (the start of
     every later epoch), and pin_memory with the host-to-device copy where CUDA is
     present.
The result carries every figure, labelled; judging is advice/'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starvecheck.core.criteria import knee
from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.signals import importing, signals_raise
from starvecheck.core.status import UsageError
from starvecheck.stages import options
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.dataloader.preflight import fit_open_files
from starvecheck.stages.dataloader.workers import prepare_workers, quiet_torch
from starvecheck.stages.loader.factory.configuration import Budget, Config, Run, measure
from starvecheck.stages.loader.factory.load import DEFAULT_FACTORY_TIMEOUT_S, Pipeline, load
from starvecheck.stages.options import FactoryOptions
from starvecheck.stages.timing import percentile

if TYPE_CHECKING:
    from starvecheck.inputs.factory import FactorySpec
    from starvecheck.inputs.workload import Workload

LAYOUT = "own"  # the label of the user's own pipeline's figures


@dataclass(frozen=True)
class Plan:
    spec: FactorySpec
    batch_size: int | None  # --batch-size: replaces the pipeline's
    workers: tuple[int, ...] | None  # --workers; None: the default sweep
    quick: bool
    effective_cpus: int
    budget_s: float
    batch_timeout_s: float
    factory_timeout_s: float = DEFAULT_FACTORY_TIMEOUT_S
    cuda: bool = False
    # What the workers must fit in, read when planned (the report's machine facts):
    # the cgroup memory limit (else the memory available) and /dev/shm's free bytes.
    memory_limit_bytes: int | None = None
    shm_free_bytes: int | None = None
    step_ms: float | None = None  # --step-ms: the GPU's step, given by the user


def default_workers(effective_cpus: int, quick: bool) -> tuple[int, ...]:
    """`loader`'s sweep (0, 1, 2, 4, ... up to twice the effective CPUs, at least 4);
    with --quick up to the effective CPUs (at least 2), the effective CPUs included."""
    counts = options.default_workers(effective_cpus)
    if not quick:
        return counts
    top = max(2, effective_cpus)
    return tuple(sorted({w for w in counts if w <= top} | {top}))


def current_config(pipeline: Pipeline) -> Config:
    s = pipeline.settings
    workers = int(s.get("num_workers", 0) or 0)
    return Config(
        workers,
        s.get("prefetch_factor") if workers else None,
        bool(s.get("persistent_workers")) if workers else False,
        bool(s.get("pin_memory")),
    )


Measure = Callable[[Pipeline, Config, Budget, Any], Run]


def sweep(
    pipeline: Pipeline,
    plan: Plan,
    progress: Callable[[str, int, int], None],
    measure_one: Measure = measure,
) -> list[tuple[str, Run]]:
    """(role, run) for every configuration measured: roles `current`, `workers`,
    `prefetch`, `persistent`, `pin`."""
    budget = Budget(plan.budget_s, plan.batch_timeout_s)
    device = "cuda" if plan.cuda else None
    now = current_config(pipeline)
    counts = plan.workers or default_workers(plan.effective_cpus, plan.quick)
    swept = [
        Config(
            w, now.prefetch_factor if w else None, now.persistent_workers and w > 0, now.pin_memory
        )
        for w in counts
    ]
    # The current configuration is a point of the sweep where its count is swept.
    todo = (
        [("workers", c) for c in swept]
        if now in swept
        else [("current", now)] + [("workers", c) for c in swept]
    )
    total = len(todo) + 3
    runs: list[tuple[str, Run]] = []

    fresh = [pipeline]

    def run(role: str, config: Config) -> None:
        progress(config.describe(), len(runs), total)
        if pipeline.iterable and runs:
            # An IterableDataset may keep state from its last reader (Streaming's shared
            # memory is laid out for the worker count it first met): a fresh one from
            # the factory for each configuration, the last fresh one released first.
            fresh.clear()
            fresh.append(load(pipeline.spec, plan.batch_size, plan.factory_timeout_s))
        pin = device if config.pin_memory else None
        runs.append((role, measure_one(fresh[0], config, budget, pin)))

    for role, config in sorted(todo, key=lambda t: t[1] != now):  # the current one first
        run(role, config)
    curve = {
        r.config.workers: r.median_samples_per_s or 0.0 for role, r in runs if role == "workers"
    }
    best = knee(curve, plan.effective_cpus)
    if best:
        base = next(r.config for role, r in runs if role == "workers" and r.config.workers == best)
        more = 4 if (base.prefetch_factor or 2) != 4 else 8
        extra = [("prefetch", replace(base, prefetch_factor=more))]
        if not base.persistent_workers:
            extra.append(("persistent", replace(base, persistent_workers=True)))
        if plan.cuda:
            extra.append(("pin", replace(base, pin_memory=not base.pin_memory)))
        for role, config in extra:
            run(role, config)
    progress("measured", total, total)
    return runs


def labels_of(role: str, config: Config, current: bool) -> dict[str, Any]:
    return {
        "layout": LAYOUT,
        "role": role,
        "current": current,
        "workers": config.workers,
        "prefetch_factor": config.prefetch_factor or (2 if config.workers else 0),
        "persistent_workers": config.persistent_workers,
        "pin_memory": config.pin_memory,
    }


def metrics_of(role: str, run: Run, current: bool) -> list[Metric]:
    """Every figure of one configuration, labelled (`current`: the user's own)."""
    c = run.config
    base = f"own.w{c.workers}" + ("" if role == "workers" else f".{role}")
    lab = labels_of(role, c, current)

    def many(name: str, values: Sequence[float], unit: str, **labels: Any) -> list[Metric]:
        return [Metric.repeated(f"{base}.{name}", values, unit, lab | labels)] if values else []

    def single(name: str, value: float | None, unit: str, **labels: Any) -> list[Metric]:
        return [] if value is None else [Metric.single(f"{base}.{name}", value, unit, lab | labels)]

    out = many("samples_per_s", run.samples_per_s, "samples/s", quantity="samples_per_s")
    out += many("batches_per_s", run.batches_per_s, "batches/s", quantity="batches_per_s")
    out += single("first_batch_s", round(run.first_batch_s, 4), "s", quantity="first_batch_s")
    for p in (50, 99) if run.waits_ms else ():
        wait = round(percentile(sorted(run.waits_ms), p), 4)
        out += single(f"batch_wait_ms.p{p}", wait, "ms", quantity="batch_wait_ms", percentile=p)
    if run.batch_bytes:
        out += single("batch_bytes", float(statistics.median(run.batch_bytes)), "bytes",
                      quantity="batch_bytes")  # fmt: skip
    out += _cpu_metrics(base, lab, run)
    out += _memory_metrics(base, lab, run)
    if run.restart_s is not None:
        out += single("epoch_start_s", round(run.restart_s, 4), "s", quantity="epoch_start_s")
    out += many("copy_ms", [x * 1e3 for x in run.copy_s], "ms", quantity="copy_ms")
    return out


def _cpu_metrics(base: str, lab: dict[str, Any], run: Run) -> list[Metric]:
    out = []
    for process, cpu in (("main", run.main_cpu_s), ("workers", run.worker_cpu_s)):
        name = f"{base}.cpu_ms_per_sample.{process}"
        q = lab | {"quantity": "cpu_ms_per_sample", "process": process}
        if cpu is None:
            out.append(Metric.missing(name, "ms", "the process's CPU times could not be read", q))
        else:
            out.append(Metric.single(name, round(cpu * 1e3 / max(run.samples, 1), 4), "ms", q))
    return out


def _memory_metrics(base: str, lab: dict[str, Any], run: Run) -> list[Metric]:
    """USS and PSS at the end and USS growth since the first batch: the training
    process's, and every worker's (repeated: one value per worker process)."""
    per: dict[str, tuple[list[float], list[float], list[float]]] = {}
    if run.main_memory is not None:
        start, end = run.main_memory
        per["main"] = ([end.uss] if end.uss else [], [end.pss] if end.pss else [], [])
        if start.uss is not None and end.uss is not None:
            per["main"][2].append(end.uss - start.uss)
    if run.worker_memory:
        per["worker"] = (
            [e.uss for _, e in run.worker_memory if e.uss is not None],
            [e.pss for _, e in run.worker_memory if e.pss is not None],
            [
                e.uss - s.uss
                for s, e in run.worker_memory
                if e.uss is not None and s.uss is not None
            ],
        )
    out = []
    for process, figures in per.items():
        for quantity, values in zip(
            ("uss_bytes", "pss_bytes", "uss_growth_bytes"), figures, strict=True
        ):
            if values:
                labels = lab | {"quantity": quantity, "process": process}
                out.append(Metric.repeated(f"{base}.{quantity}.{process}", values, "bytes", labels))
    return out


def result(pipeline: Pipeline, plan: Plan, runs: Sequence[tuple[str, Run]]) -> StageResult:
    metrics: list[Metric] = []
    caveats: list[Caveat] = []
    configs = []
    now = current_config(pipeline)
    for role, run in runs:
        metrics += metrics_of(role, run, run.config == now)
        configs.append(
            {
                "role": role,
                "config": run.config.describe(),
                "workers": run.config.workers,
                "stopped": run.stopped,
                "batches": run.batches,
                "samples": run.samples,
                "seconds": round(run.seconds, 3),
                "epochs": run.epochs,
            }
        )
    budget = [c["config"] for c in configs if c["stopped"] == "budget"]
    if budget:
        caveats.append(
            Caveat(
                "timing.budget",
                f"{len(budget)} configuration(s) were still changing when their "
                f"{plan.budget_s:g} s were spent ({', '.join(budget[:4])}"
                f"{', ...' if len(budget) > 4 else ''}): their medians are of the windows read",
            )
        )
    parameters: dict[str, Any] = {
        "source": "factory",
        "factory": plan.spec.text,
        "dataset": pipeline.describe(),
        "samples_in_dataset": pipeline.length,
        "given_dataloader": pipeline.given,
        "shuffle": bool(pipeline.settings.get("shuffle"))
        or type(pipeline.settings.get("sampler")).__name__ == "RandomSampler",
        "batch_size": pipeline.settings.get("batch_size"),
        "current": current_config(pipeline).describe(),
        "effective_cpus": plan.effective_cpus,
        "memory_limit_bytes": plan.memory_limit_bytes,
        "shm_free_bytes": plan.shm_free_bytes,
        "budget_s": plan.budget_s,
        "step_ms": plan.step_ms,
        "factory_s": round(pipeline.factory_s, 3),
        "configurations": configs,
    }
    return StageResult("factory", parameters=parameters, metrics=metrics, caveats=caveats)


def plan_of(options: FactoryOptions, ctx: RunContext) -> Plan:
    """The plan of `loader --factory`: the worker counts asked for, fitted to the
    open-file limit; what the workers must fit in, from this machine's facts."""
    m = ctx.machine
    workers = options.workers
    if workers is not None:
        fit = fit_open_files(workers)
        if not fit.workers:
            raise UsageError(fit.warning or "no worker count fits the open-file limit")
        if fit.warning:
            ctx.warn(fit.warning)
        workers = fit.workers
    return Plan(
        spec=options.spec,
        batch_size=options.batch_size,
        workers=workers,
        quick=options.quick,
        effective_cpus=ctx.effective_cpus,
        budget_s=options.budget_s or FactoryOptions.BUDGET_S[options.quick],
        batch_timeout_s=ctx.batch_timeout_s,
        factory_timeout_s=options.factory_timeout_s,
        memory_limit_bytes=m.memory.limit_bytes or m.memory.available_bytes if m else None,
        shm_free_bytes=m.shm.free_bytes if m else None,
        step_ms=options.step_ms,
    )


def run_factory(plan: Plan, progress: Callable[[str, int, int], None]) -> StageResult:
    """Load the user's pipeline and sweep it. The caller turns signals into exceptions
    (signals_raise): workers are stopped on every way out."""
    import time

    with importing():
        import torch

    started = time.perf_counter()
    pipeline = load(plan.spec, plan.batch_size, plan.factory_timeout_s)
    plan = replace(plan, cuda=torch.cuda.is_available())
    counts = plan.workers or default_workers(plan.effective_cpus, plan.quick)
    if any(counts) or pipeline.current_workers:
        prepare_workers()
    out = result(pipeline, plan, sweep(pipeline, plan, progress))
    return replace(out, duration_s=round(time.perf_counter() - started, 3))


class FactoryStage(BaseStage[FactoryOptions, Plan]):
    """`loader --factory` in the registry (stages/base.Stage): the user's own pipeline,
    swept. Its result reports under `loader` (core/model.REPORTED_AS)."""

    name = "factory"

    def plan(self, options: FactoryOptions, ctx: RunContext) -> Plan:
        return plan_of(options, ctx)

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> Plan:
        """doctor's loader link on the user's own pipeline, at the workload's batch size
        where one was given."""
        assert workload.factory is not None  # doctor runs this stage only with one
        options = FactoryOptions(
            spec=workload.factory,
            batch_size=workload.batch_size if workload.source("batch_size") != "default" else None,
            quick=quick,
        )
        return plan_of(options, ctx)

    def measure(self, plan: Plan, ctx: RunContext) -> StageResult:
        """Load the pipeline and sweep it. SIGTERM/SIGHUP raise like Ctrl-C while this
        runs, and a DataLoader that delivers nothing within the batch timeout ends it:
        workers are shut down on every way out."""
        with signals_raise(), quiet_torch():
            return run_factory(plan, ctx.progress)


STAGE = FactoryStage()
