"""`loader --factory`: the user's own pipeline swept over DataLoader settings.

Configurations, in this order, each measured by stages/loader/factory/configuration.py until stable:
  1. the current one: the user's DataLoader as returned (num_workers, prefetch_factor,
     persistent_workers, pin_memory), or num_workers=0 for a bare Dataset;
  2. num_workers swept (--workers, or 0, 1, 2, 4, ... as `loader` sweeps), the rest
     as the current configuration has it; where that one starts its workers every
     epoch, it is read first, and where start-up holds the largest share of its wait
     the counts are read with persistent_workers=True (start-up's fix: epochs.py);
  3. at the knee of that sweep (criteria.knee: the fewest workers within 5% of the best
     at or below the effective CPUs, the rule the recommendation uses, here only to
     decide where to measure more): prefetch_factor 4
     against the current one, persistent_workers=True where it is off (the start of
     every later epoch), and pin_memory with the host-to-device copy where CUDA is
     present; the current configuration read again in those rounds (`again`), which
     the variants' gains are read against.
The result carries every figure, labelled; judging is advice/'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from starvecheck.core.criteria import (
    cpu_work,
)
from starvecheck.core.explained import Cost, unexplained
from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.factory import SWEPT, Role, StepRead
from starvecheck.core.signals import importing, signals_raise
from starvecheck.core.stages import FACTORY
from starvecheck.stages import options
from starvecheck.stages.base import BaseStage, RunContext, no_warning
from starvecheck.stages.dataloader.deaths import Strays
from starvecheck.stages.dataloader.workers import prepare_workers, quiet_torch
from starvecheck.stages.loader.factory.configuration import measure
from starvecheck.stages.loader.factory.ending import describe, left_threads
from starvecheck.stages.loader.factory.epochs import restarting, startup_bound
from starvecheck.stages.loader.factory.figures import metrics_of
from starvecheck.stages.loader.factory.fits import check_files, check_spawnable, fit_run
from starvecheck.stages.loader.factory.guard import guarding, recorded, user_code
from starvecheck.stages.loader.factory.idle import idle_worker_uss
from starvecheck.stages.loader.factory.load import (
    DEFAULT_FACTORY_TIMEOUT_S,
    Pipeline,
    load,
)
from starvecheck.stages.loader.factory.loaders import Config, current_config
from starvecheck.stages.loader.factory.outcome import result
from starvecheck.stages.loader.factory.rounds import ROUNDS, Measure, read_rounds
from starvecheck.stages.loader.factory.run import Budget, Run
from starvecheck.stages.loader.factory.settled import (
    counts_settled,
    knee_run,
    variants_settled_runs,
)
from starvecheck.stages.loader.factory.spare import Tally, decides, grows, reads_on, spare_count
from starvecheck.stages.loader.factory.startmethod import other_method, pickled
from starvecheck.stages.loader.factory.stepped import read_with_step
from starvecheck.stages.options import FactoryOptions

if TYPE_CHECKING:
    from starvecheck.inputs.factory import FactorySpec
    from starvecheck.inputs.workload import Workload


# Importable from here, where callers have found them.
__all__ = ["Plan", "current_config", "metrics_of", "result", "run_factory", "sweep"]


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
    idle_worker_uss_bytes: int | None = None  # a worker that has read nothing (idle.py)
    current_fits: bool = True  # False: its workers do not fit the machine's limits (fits.py)
    # The dataset as a forkserver or spawn worker receives it (startmethod.py), and the
    # start method the recommended count is read under beside its own (None: not read).
    pickle_bytes: int | None = None
    pickle_s: float | None = None
    pickle_error: str | None = None
    other_method: str | None = None
    # --quick's spare count (spare.py), checked against the machine's limits: read
    # where the first round asks for it; None: none fits, or not --quick.
    spare: int | None = None


def default_workers(effective_cpus: int, quick: bool) -> tuple[int, ...]:
    """`loader`'s sweep (0, 1, 2, 4, ... up to twice the effective CPUs, at least 4);
    with --quick up to the effective CPUs (at least 2), the effective CPUs included."""
    counts = options.default_workers(effective_cpus)
    if not quick:
        return counts
    top = max(2, effective_cpus)
    return tuple(sorted({w for w in counts if w <= top} | {top}))


def sweep(
    pipeline: Pipeline,
    plan: Plan,
    progress: Callable[[str, int, int], None],
    measure_one: Measure = measure,
    strays: Strays | None = None,
    reread: list[str] | None = None,
    stepped: list[StepRead] | None = None,
) -> list[tuple[str, Run]]:
    """(role, run) for every configuration measured: roles `current`, `workers`, `base`,
    `prefetch`, `persistent`, `pin`, `again`. Two sets, each read in interleaved rounds
    (rounds.py): the worker counts (and the current configuration), then (not with
    --quick: QUICK_COUNTS), at the count
    the first set's figures call enough, prefetch_factor, persistent_workers and (with
    CUDA) pin_memory beside that count itself (`base`) and the current configuration
    (`again`). Where the first set's ratios are past what their worker counts explain
    (core/explained.py: a disturbed measurement), it is read once more, in as many
    rounds, and its figures are the second reading's; what the first said is appended
    to `reread`. With --step-ms, what `stepped` gets: the count and the current settings
    read with the step."""
    rounds = 1 if pipeline.fixed else plan.rounds or ROUNDS[plan.quick]
    # A slow configuration's rate from one batch a worker past the last one's first
    # (made.py): the rounds give its spread, and read on until they settle it.
    budget = Budget(plan.budget_s / rounds, plan.batch_timeout_s, False, intervals=1)
    device = "cuda" if plan.cuda else None
    first = _first_set(pipeline, plan)
    second = not pipeline.fixed and not plan.quick
    tally = Tally((len(first) + (5 if second else 0)) * rounds)
    now = current_config(pipeline)
    grow = grows(plan.spare, rounds, tally)
    decided = decides(now, rounds, tally)

    # An IterableDataset may keep state from its last reader (Streaming's shared memory
    # is laid out for the worker count it first met): one from the factory for each
    # configuration, kept for its every round.
    pipelines: dict[Config, Pipeline] = {}

    def read_one(config: Config, budget: Budget = budget) -> Run:
        if pipeline.iterable and config not in pipelines:
            pipelines[config] = pipeline
            if len(pipelines) > 1:
                with user_code():
                    pipelines[config] = load(pipeline.spec, plan.batch_size, plan.factory_timeout_s)
        since = strays.now() if strays is not None else set()
        try:
            # With CUDA every configuration copies each batch to the device, as the
            # loop does, pinned or not: pin_memory's A/B is the copy's too.
            run = measure_one(pipelines.get(config, pipeline), config, budget, device)
        finally:
            if config.workers and strays is not None:  # the main process's, at the end
                strays.stop(since)
        tally.done += 1
        return run

    def said(what: str) -> None:
        progress(what, tally.done, tally.total)

    given: dict[Config, Run] = {}
    if restarting(now, pipeline.fixed or not plan.current_fits):
        said(f"round 1 of {rounds}: {now.describe()}")
        given[now] = read_one(now)
        first = _kept_if_starting(given[now], first, pipeline, plan, tally, rounds)
    least = LEAST_ROUNDS[plan.quick]
    settled = functools.partial(counts_settled, now=now, cpus=plan.effective_cpus)
    more = reads_on(now, plan.effective_cpus, tally, plan.quick, plan.budget_s)
    runs = read_rounds(first, rounds, read_one, said, settled, least, grow, decided, given, more)
    disturbed = disturbed_counts(runs, plan.effective_cpus)
    if disturbed:
        if reread is not None:
            reread += disturbed
        first = [(role, r.config) for role, r in runs]  # the spare too, where it was read
        tally.total += len(first) * rounds
        runs = read_rounds(first, rounds, read_one, said, settled, least)
    if second:  # --quick: the counts only (QUICK_COUNTS)
        second_set = _second_set(runs, plan, now)
        runs += read_rounds(second_set, rounds, read_one, said, variants_settled_runs, least)
    if stepped is not None and not (pipeline.iterable or pipeline.fixed):  # stepped.py
        stepped += read_with_step(runs, now, plan, budget, read_one, said, tally)
    progress("measured", tally.total, tally.total)
    return runs


# Rounds read at least before a set may stop, once more rounds could not change what
# judging makes of it (criteria.knee_settled, variants_settled): full, quick.
LEAST_ROUNDS = {False: 2, True: 2}


def disturbed_counts(runs: Sequence[tuple[str, Run]], cpus: float) -> list[str]:
    """The worker counts' ratios past what the counts explain (core/explained.py), in
    words; the workers' measured time says which counts are CPU work."""
    counts = [r for role, r in runs if role in SWEPT]
    rates = {r.config.workers: r.samples_per_s for r in counts}
    work = {
        r.config.workers: cpu_work(r.worker_cpu_s, r.worker_runq_s, r.worker_alive_s)
        for r in counts
        if r.config.workers
    }
    costs = {r.config.workers: run_cost(r) for r in counts}
    return [u.describe() for u in unexplained(rates, cpus, work, costs)]


def run_cost(r: Run) -> Cost:
    """One sample's CPU and blocked time (core/explained.Cost), ms, from a run's figures."""
    n = r.samples
    if not n:
        return Cost(None, None)
    if not r.config.workers:
        rate = r.median_samples_per_s
        cpu, runq = r.main_cpu_s, r.main_runq_s
        if cpu is None or runq is None or not rate:
            return Cost(None if cpu is None else cpu * 1e3 / n, None)
        return Cost(cpu * 1e3 / n, max(0.0, 1e3 / rate - (cpu + runq) * 1e3 / n))
    cpu, runq, alive = r.worker_cpu_s, r.worker_runq_s, r.worker_alive_s
    blocked = None
    if cpu is not None and runq is not None and alive is not None:
        blocked = max(0.0, alive - cpu - runq) * 1e3 / n
    return Cost(None if cpu is None else cpu * 1e3 / n, blocked)


def _kept_if_starting(
    now: Run,
    first: list[tuple[str, Config]],
    pipeline: Pipeline,
    plan: Plan,
    tally: Tally,
    rounds: int,
) -> list[tuple[str, Config]]:
    """Where start-up holds most of the current settings' wait (read first), the counts
    read with their workers kept: the count chosen feeds the loop once they are kept."""
    if not startup_bound(now):
        return first
    kept = _first_set(pipeline, plan, persistent=True)
    tally.total += (len(kept) - len(first)) * rounds
    return kept


def _first_set(
    pipeline: Pipeline, plan: Plan, persistent: bool = False
) -> list[tuple[str, Config]]:
    """The worker counts swept, the rest as the current configuration has it (with
    `persistent`, the workers kept across epochs), and the current configuration where
    its count is not swept."""
    now = current_config(pipeline)
    if pipeline.fixed:
        return [(Role.CURRENT, now)]
    counts = (
        default_workers(plan.effective_cpus, plan.quick) if plan.workers is None else plan.workers
    )
    keep = now.persistent_workers or persistent
    swept = [
        Config(w, now.prefetch_factor if w else None, keep and w > 0, now.pin_memory)
        for w in counts
    ]
    first: list[tuple[str, Config]] = [(Role.WORKERS, c) for c in swept]
    return first if now in swept or not plan.current_fits else [(Role.CURRENT, now), *first]


def _second_set(runs: list[tuple[str, Run]], plan: Plan, now: Config) -> list[tuple[str, Config]]:
    """The count the first set calls enough (the fewest within 5% of the best, round by
    round; past the CPUs only for workers measured blocked, as advice/ judges), read
    again beside its variants, and the current configuration read again in the same
    rounds (`again`), so that a variant's gain over it is read side by side, never
    chained through another set's rounds; nothing at num_workers=0."""
    knee = knee_run(runs, plan.effective_cpus)
    base = knee.config if knee is not None else None
    if base is None or not base.workers:
        return []
    more = 4 if (base.prefetch_factor or 2) != 4 else 8
    second: list[tuple[str, Config]] = [
        (Role.BASE, base),
        (Role.PREFETCH, replace(base, prefetch_factor=more)),
    ]
    if not base.persistent_workers:
        second.append((Role.PERSISTENT, replace(base, persistent_workers=True)))
    if plan.cuda:
        second.append((Role.PIN, replace(base, pin_memory=not base.pin_memory)))
    if plan.other_method is not None:  # the count under the other start method
        second.append((Role.START, replace(base, context=plan.other_method)))
    if now != base and plan.current_fits:
        second.append((Role.AGAIN, now))
    return second


def quick_sweep(plan: Plan) -> bool:
    """--quick's own sweep (no --workers): the one that may add a spare count."""
    return plan.quick and plan.workers is None


def plan_of(options: FactoryOptions, ctx: RunContext) -> Plan:
    """The plan of `loader --factory`: the worker counts asked for (fitted to the
    machine's limits once the pipeline is loaded, fits.py; below what num_workers=0
    needs of open files, one line here); what the workers must fit in, from this
    machine's facts."""
    m = ctx.machine
    check_files(options.workers or default_workers(ctx.effective_cpus, options.quick))
    return Plan(
        spec=options.spec,
        batch_size=options.batch_size,
        workers=options.workers,
        quick=options.quick,
        effective_cpus=ctx.effective_cpus,
        budget_s=options.budget_s or FactoryOptions.BUDGET_S[options.quick],
        batch_timeout_s=ctx.batch_timeout_s,
        factory_timeout_s=options.factory_timeout_s,
        memory_limit_bytes=m.memory.limit_bytes or m.memory.available_bytes if m else None,
        # Free space where it can be read, else the size (a fake machine's /dev/shm).
        shm_free_bytes=(m.shm.free_bytes or m.shm.size_bytes) if m else None,
        step_ms=options.step_ms,
    )


def run_factory(
    plan: Plan, progress: Callable[[str, int, int], None], warn: Callable[[str], None] = no_warning
) -> StageResult:
    """Load the user's pipeline and sweep it: the worker counts that do not fit the
    open-file and pids limits or /dev/shm left out (fits.py), and processes the
    pipeline left running stopped.
    The caller turns signals into exceptions (signals_raise): workers are stopped on
    every way out."""
    with importing("torch"):
        import torch

    strays = Strays()
    strays.mark()  # what FUNC, the dataset and the workers start from here on
    # multiprocessing's pymp-* directory, made and recorded (in the marker of the
    # run's scratch directory, `recorded`) before the user's code runs: a run that code
    # kills, or that is killed while it runs, leaves it to `starvecheck clean`.
    prepare_workers()
    with user_code():
        pipeline = load(plan.spec, plan.batch_size, plan.factory_timeout_s)
    plan = replace(plan, cuda=torch.cuda.is_available(), torch_threads=torch.get_num_threads())
    counts = plan.workers or default_workers(plan.effective_cpus, plan.quick)
    try:
        if any(counts) or pipeline.current_workers:
            check_spawnable(pipeline)
            now = current_config(pipeline)
            spare = spare_count(plan.effective_cpus, counts) if quick_sweep(plan) else None
            with user_code():  # one batch read at num_workers=0 for its bytes
                kept, fits, spared = fit_run(
                    pipeline, counts, now, plan.batch_timeout_s, warn, spare
                )
            dropped = kept != tuple(counts)
            plan = replace(
                plan,
                workers=kept if dropped else plan.workers,
                current_fits=fits,
                spare=spare if spared and not dropped else None,
            )
            idle = idle_worker_uss(pipeline.settings.get("multiprocessing_context"))
            plan = replace(plan, idle_worker_uss_bytes=idle)
            plan = _start_methods(pipeline, plan)
        reread: list[str] = []
        stepped: list[StepRead] = []
        runs = sweep(pipeline, plan, progress, strays=strays, reread=reread, stepped=stepped)
        out = result(pipeline, plan, runs, reread, stepped)
        if threads := [describe(t) for t in left_threads()]:  # the process will not wait
            said = THREADS_LEFT.format(len(threads), "; ".join(threads[:8]))
            out = replace(out, caveats=(*out.caveats, Caveat("loader.threads-left", said)))
    finally:
        strays.stop()
        strays.say(warn)
    return out


def _start_methods(pipeline: Pipeline, plan: Plan) -> Plan:
    """The dataset's pickle (what a forkserver or spawn worker receives), and, in the
    full run, the other start method to read the recommended count under: only where
    the dataset pickles (else the pipeline cannot start there: said by judging)."""
    if pipeline.fixed:
        return plan
    with user_code():  # the dataset's own __reduce__ runs
        got = pickled(pipeline.dataset)
    other = other_method(pipeline.settings.get("multiprocessing_context"))
    readable = got.nbytes is not None and not plan.quick
    return replace(
        plan,
        pickle_bytes=got.nbytes,
        pickle_s=round(got.seconds, 4),
        pickle_error=got.error,
        other_method=other if readable else None,
    )


THREADS_LEFT = (
    "The pipeline's code left {} thread(s) running past the measurement ({}): "
    "starvecheck ends its process without waiting for them"
)


class FactoryStage(BaseStage[FactoryOptions, Plan]):
    """`loader --factory` in the registry (stages/base.Stage): the user's own pipeline,
    swept. Its result reports under `loader` (core/stages.py, `reported_as`)."""

    name = FACTORY

    def plan(self, options: FactoryOptions, ctx: RunContext) -> Plan:
        return plan_of(options, ctx)

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> Plan:
        """doctor's loader link on the user's own pipeline, at the workload's batch size
        where one was given, and judged against its step where that is known (given or
        measured, never assumed): a loading gain becomes a training one only then."""
        assert workload.factory is not None  # doctor runs this stage only with one
        known = workload.source("step_ms") in ("option", "file", "measured")
        options = FactoryOptions(
            spec=workload.factory,
            batch_size=workload.batch_size if workload.source("batch_size") != "default" else None,
            quick=quick,
            step_ms=workload.step_ms if known and workload.step_ms else None,
        )
        return plan_of(options, ctx)

    def measure(self, plan: Plan, ctx: RunContext) -> StageResult:
        """Load the pipeline and sweep it. SIGTERM/SIGHUP raise like Ctrl-C while this
        runs, and a DataLoader that delivers nothing within the batch timeout ends it:
        workers are shut down on every way out."""
        where = f"loader --factory {plan.spec.text}"
        with signals_raise(), recorded(), quiet_torch(), guarding(where, ctx.warn):
            return run_factory(plan, ctx.progress, ctx.warn)


STAGE = FactoryStage()
