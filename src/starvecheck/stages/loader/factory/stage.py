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

from starvecheck.core.criteria import cpu_work, paired_knee
from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.signals import importing, signals_raise
from starvecheck.core.status import UsageError
from starvecheck.stages import options
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.dataloader.preflight import fit_open_files
from starvecheck.stages.dataloader.workers import prepare_workers, quiet_torch
from starvecheck.stages.loader.factory.configuration import Budget, Run, measure
from starvecheck.stages.loader.factory.load import DEFAULT_FACTORY_TIMEOUT_S, Pipeline, load
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.rounds import ROUNDS, Measure, read_rounds
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
    rounds: int | None = None  # None: ROUNDS[quick]
    torch_threads: int | None = None  # torch's intra-op threads in this process


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


def sweep(
    pipeline: Pipeline,
    plan: Plan,
    progress: Callable[[str, int, int], None],
    measure_one: Measure = measure,
) -> list[tuple[str, Run]]:
    """(role, run) for every configuration measured: roles `current`, `workers`, `base`,
    `prefetch`, `persistent`, `pin`. Two sets, each read in interleaved rounds
    (rounds.py): the worker counts (and the current configuration), then, at the count
    the first set's figures call enough, prefetch_factor, persistent_workers and (with
    CUDA) pin_memory beside that count itself (`base`)."""
    rounds = 1 if pipeline.fixed else plan.rounds or ROUNDS[plan.quick]
    budget = Budget(plan.budget_s / rounds, plan.batch_timeout_s, until_stable=False)
    device = "cuda" if plan.cuda else None
    first = _first_set(pipeline, plan)
    total = (len(first) + 3) * rounds
    done = [0]
    # An IterableDataset may keep state from its last reader (Streaming's shared memory
    # is laid out for the worker count it first met): one from the factory for each
    # configuration, kept for its every round.
    pipelines: dict[Config, Pipeline] = {}

    def read_one(config: Config) -> Run:
        if pipeline.iterable and config not in pipelines:
            pipelines[config] = (
                load(pipeline.spec, plan.batch_size, plan.factory_timeout_s)
                if pipelines
                else pipeline
            )
        pin = device if config.pin_memory else None
        run = measure_one(pipelines.get(config, pipeline), config, budget, pin)
        done[0] += 1
        return run

    def said(what: str) -> None:
        progress(what, done[0], total)

    runs = read_rounds(first, rounds, read_one, said)
    if not pipeline.fixed:
        runs += read_rounds(_second_set(runs, plan), rounds, read_one, said)
    progress("measured", total, total)
    return runs


def _first_set(pipeline: Pipeline, plan: Plan) -> list[tuple[str, Config]]:
    """The worker counts swept, the rest as the current configuration has it, and the
    current configuration where its count is not swept."""
    now = current_config(pipeline)
    if pipeline.fixed:
        return [("current", now)]
    counts = plan.workers or default_workers(plan.effective_cpus, plan.quick)
    swept = [
        Config(
            w, now.prefetch_factor if w else None, now.persistent_workers and w > 0, now.pin_memory
        )
        for w in counts
    ]
    first = [("workers", c) for c in swept]
    return first if now in swept else [("current", now), *first]


def _second_set(runs: list[tuple[str, Run]], plan: Plan) -> list[tuple[str, Config]]:
    """The count the first set calls enough (the fewest within 5% of the best, round by
    round; past the CPUs only for workers measured blocked, as advice/ judges), read
    again beside its variants; nothing at num_workers=0."""
    swept = [r for role, r in runs if role == "workers"]
    if not swept:
        return []
    rates = {r.config.workers: r.samples_per_s for r in swept}
    at_best = max(swept, key=_median_rate)
    worked = cpu_work(at_best.worker_cpu_s, at_best.worker_runq_s, at_best.worker_alive_s)
    best = paired_knee(rates, plan.effective_cpus if worked is not False else max(rates))
    base = next((r.config for r in swept if r.config.workers == best), None)
    if base is None or not base.workers:
        return []
    more = 4 if (base.prefetch_factor or 2) != 4 else 8
    second = [("base", base), ("prefetch", replace(base, prefetch_factor=more))]
    if not base.persistent_workers:
        second.append(("persistent", replace(base, persistent_workers=True)))
    if plan.cuda:
        second.append(("pin", replace(base, pin_memory=not base.pin_memory)))
    return second


def _median_rate(run: Run) -> float:
    return statistics.median(run.samples_per_s) if run.samples_per_s else 0.0


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
    """Per sample: CPU time, time runnable but waiting for a CPU (run queue), and the
    workers' blocked time (alive, neither on a CPU nor waiting for one: I/O, sleep, a
    full queue); per round, the CPUs other processes kept busy."""
    out = []
    n = max(run.samples, 1)
    per_sample = (
        ("cpu_ms_per_sample", "main", run.main_cpu_s, "the process's CPU times could not be read"),
        (
            "cpu_ms_per_sample",
            "workers",
            run.worker_cpu_s,
            "the workers' CPU times could not be read",
        ),
        ("runq_ms_per_sample", "main", run.main_runq_s, "no schedstat for this process"),
        ("runq_ms_per_sample", "workers", run.worker_runq_s, "no schedstat for the workers"),
    )
    for quantity, process, seconds, why in per_sample:
        if quantity == "runq_ms_per_sample" and process == "workers" and not run.config.workers:
            continue
        name = f"{base}.{quantity}.{process}"
        q = lab | {"quantity": quantity, "process": process}
        if seconds is None:
            out.append(Metric.missing(name, "ms", why, q))
        else:
            out.append(Metric.single(name, round(seconds * 1e3 / n, 4), "ms", q))
    alive, cpu, runq = run.worker_alive_s, run.worker_cpu_s, run.worker_runq_s
    if run.config.workers and alive is not None and cpu is not None and runq is not None:
        blocked = max(0.0, alive - cpu - runq)
        q = lab | {"quantity": "blocked_ms_per_sample", "process": "workers"}
        out.append(
            Metric.single(
                f"{base}.blocked_ms_per_sample.workers", round(blocked * 1e3 / n, 4), "ms", q
            )
        )
    if run.main_cpu_s is not None and run.main_span_s:
        q = lab | {"quantity": "cpus_busy", "process": "main"}
        busy = round(run.main_cpu_s / run.main_span_s, 3)
        out.append(Metric.single(f"{base}.cpus_busy.main", busy, "CPUs", q))
    others = [x for x in run.others_each if x is not None]
    if others and len(others) == len(run.others_each):
        q = lab | {"quantity": "others_cpus"}
        out.append(Metric.repeated(f"{base}.others_cpus", [round(x, 3) for x in others], "CPUs", q))
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
    parameters: dict[str, Any] = {
        "source": "factory",
        "factory": plan.spec.text,
        "dataset": pipeline.describe(),
        "samples_in_dataset": pipeline.length,
        "given_dataloader": pipeline.given,
        "read_as_is": pipeline.fixed,
        "shuffle": bool(pipeline.settings.get("shuffle"))
        or type(pipeline.settings.get("sampler")).__name__ == "RandomSampler",
        "batch_size": pipeline.settings.get("batch_size"),
        "current": current_config(pipeline).describe(),
        "effective_cpus": plan.effective_cpus,
        "memory_limit_bytes": plan.memory_limit_bytes,
        "shm_free_bytes": plan.shm_free_bytes,
        "budget_s": plan.budget_s,
        "rounds": plan.rounds or ROUNDS[plan.quick],
        "torch_threads": plan.torch_threads,
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
    plan = replace(plan, cuda=torch.cuda.is_available(), torch_threads=torch.get_num_threads())
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
