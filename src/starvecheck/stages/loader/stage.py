"""`loader`: samples per second through a real torch DataLoader, per data layout and
num_workers, cold and warm.

The same samples, stored three ways in a fresh scratch directory under PATH:
  small_files  one file per sample; a map-style dataset under DataLoader(shuffle=True)
  shard        one contiguous file and an index of offsets; map-style, shuffled, each
               worker opening the file once (lazily) and reading samples with pread
  mds          MosaicML Streaming MDS shards written by MDSWriter and read by
               StreamingDataset(local=..., shuffle=True, batch_size=...)
or, with --existing, a sample of the user's own files (`files`), read-only.

Every sample becomes a uint8 tensor and batches are collated as a training job's
are (stacked; in shared memory when workers make them). Each measured epoch runs
through a fresh DataLoader (persistent_workers=False) and records when every batch
arrived:
  throughput     samples/s once started: from the batch that drains the prefetch
                 queue (1 + workers x prefetch_factor) to the last one; start-up is
                 paid once per epoch and reported on its own
  first_batch_s  from iter(loader) to the first batch: worker start-up
  batch_wait_ms  time blocked in next(iterator) for every later batch (p50, p99)
A cold epoch starts with the layout's files evicted and `mincore` checked, as in `io`.
The epochs are measured in epochs.py; here, the plan, the data, and the figures.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loader import FirstBatch, LoaderFigures, Point, Unmeasured
from starvecheck.core.schema.samples import Cache, Layout
from starvecheck.core.signals import importing, signals_raise
from starvecheck.core.status import UsageError
from starvecheck.probe.cpu import under_hypervisor
from starvecheck.scratch.directory import Scratch
from starvecheck.stages.base import BaseStage, OnDisk, RunContext
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S
from starvecheck.stages.dataloader.workers import quiet_torch
from starvecheck.stages.loader.epochs import Measured, measure_or_fail
from starvecheck.stages.options import LoaderOptions, default_workers
from starvecheck.stages.samples.layouts import MB, Progress
from starvecheck.stages.samples.mds import streaming_or_why
from starvecheck.stages.samples.plan import Plan
from starvecheck.stages.samples.residency import judge_cache
from starvecheck.stages.samples.sources import Source, existing_sources, generate
from starvecheck.stages.timing import (
    UNSTABLE_SPREAD,
    hypervisor_cache,
    outliers,
    percentile,
    too_few_runs,
)
from starvecheck.stages.timing import unstable as timing_unstable

if TYPE_CHECKING:
    from starvecheck.inputs.workload import Workload


# --- summarising -------------------------------------------------------------------------


def summarize(
    names: Sequence[str], plan: Plan, m: Measured, fs_kind: str | None = None
) -> tuple[LoaderFigures, list[Caveat], dict[str, str]]:
    """The figures (as the README names them), caveats, and the cache state each
    layout's first_batch_s comes from."""
    residency, caveats, not_cold = judge_cache(
        names,
        m,
        fs_kind,
        command="loader",
        unit="epoch",
        fix="pages not yet written back cannot be evicted (files written moments ago: run "
        "`sync` first), and some filesystems keep their pages (FUSE daemons, network caches)",
    )
    unstable: list[str] = []
    first_cache: dict[str, str] = {}
    points: list[Point] = []
    first: list[FirstBatch] = []
    for name in names:
        layout = Layout(name)
        for temp in plan.temperatures:
            for w in plan.workers:
                epochs = m.epochs.get((name, temp, w), [])
                where = (layout, Cache(temp), w)
                if temp == Cache.COLD and name in not_cold:
                    gone = Figure.missing(not_cold[name])
                    points.append(Point(*where, gone, gone, gone, gone))
                    continue
                rates = [e.steady_samples / e.seconds for e in epochs if e.seconds > 0]
                mbps = [e.steady_bytes / e.seconds / MB for e in epochs if e.seconds > 0]
                waits = sorted(x * 1000 for e in epochs for x in e.waits_s)
                none = Figure.missing("one batch per epoch: no waits after it")
                p50, p99 = (
                    Figure.single(round(percentile(waits, p), 4)) if waits else none
                    for p in (50, 99)
                )
                rate = Figure.repeated(rates)
                points.append(Point(*where, rate, Figure.repeated(mbps), p50, p99))
                if len(rates) >= 2 and statistics.median(rates) > 0:
                    spread = statistics.stdev(rates) / statistics.median(rates)
                    if spread >= UNSTABLE_SPREAD or outliers(rates):
                        unstable.append(f"{name}.{temp}.w{w} {spread:.0%}")
        # Start-up is a property of the workers, not the cache: one figure per count,
        # from the cold epochs where they count, else the warm ones.
        temp = Cache.COLD if plan.cold and name not in not_cold else Cache.WARM
        first_cache[name] = temp.value
        for w in plan.workers:
            starts = [round(e.first_batch_s, 5) for e in m.epochs.get((name, temp, w), [])]
            first.append(FirstBatch(layout, w, Figure.repeated(starts)))
    if unstable:
        caveats.append(timing_unstable(unstable, "epochs"))
    if plan.runs < 3:
        caveats.append(
            too_few_runs(
                f"{plan.runs} epoch(s) per point: too few to judge the spread; "
                "`starvecheck loader --runs 3` or more"
            )
        )
    figures = LoaderFigures(tuple(residency), tuple(points), tuple(first))
    return figures, caveats, first_cache


# --- the stage ---------------------------------------------------------------------------


def _run(
    path: str,
    plan: Plan,
    existing: bool,
    storage: Mapping[str, Any],
    progress: Progress,
    warn: Callable[[str], None],
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> StageResult:
    """LoaderStage.measure's work."""
    import multiprocessing

    with importing("torch"):
        import torch

    from starvecheck.stages.dataloader import preflight

    sample = (1 << 20) if existing else plan.sample_size  # existing: files up to 8 MiB, most small
    plan = preflight.fitted(plan, plan.batch_size * sample, plan.prefetch_factor, warn)
    params: dict[str, Any] = {"path": path, **plan.parameters()}
    caveats: list[str] = []
    unmeasured: list[Unmeasured] = []
    cuda = torch.cuda.is_available()
    pin = cuda if plan.pin_memory is None else plan.pin_memory
    if pin and not cuda:
        caveats.append(
            Caveat(
                "loader.not-pinned", "--pin-memory: no CUDA device here, so memory was not pinned"
            )
        )
        pin = False
    params.update(pin_memory=pin, start_method=multiprocessing.get_start_method())
    with signals_raise(), quiet_torch():
        if existing:
            sources, extra, more = existing_sources(path, plan)
            params.update(extra)
            caveats += more
            measured = measure_or_fail(sources, plan, pin, progress, batch_timeout_s)
        else:
            streaming, why = streaming_or_why(path) if plan.wants("mds") else (None, "")
            if streaming is None and plan.wants("mds"):
                unmeasured.append(Unmeasured(Layout.MDS, why))
            sources, measured, params["scratch"] = _generated(
                path, plan, streaming, pin, progress, warn, batch_timeout_s
            )
    names = [s.name for s in sources]
    figures, more, first_cache = summarize(names, plan, measured, storage.get("kind"))
    caveats += more
    params["first_batch_cache"] = first_cache
    figures = replace(figures, unmeasured=tuple(unmeasured))
    if plan.cold and under_hypervisor():
        caveats.append(
            hypervisor_cache(
                "this is a virtual machine: the hypervisor may cache the virtual disk, "
                "which makes cold epochs faster than the physical device would"
            )
        )
    return StageResult(
        stage="loader",
        parameters=params,
        metrics=figures.to_metrics(),
        caveats=tuple(caveats),
    )


def _generated(
    path: str,
    plan: Plan,
    streaming: Any | None,
    pin: bool,
    progress: Progress,
    warn: Callable[[str], None],
    batch_timeout_s: float,
) -> tuple[list[Source], Measured, str]:
    """The samples written in a fresh scratch directory under `path` (MDS too with
    `streaming`) and measured, then removed on every way out: the layouts, their
    figures, and the scratch directory they were in."""
    scratch = Scratch(path, prefix="starvecheck-loader-", warn=warn)
    try:
        with scratch:
            try:
                sources = generate(scratch, plan, streaming, progress)
                measured = measure_or_fail(sources, plan, pin, progress, batch_timeout_s)
            except OSError as e:
                raise UsageError(f"writing test data in {scratch.path} failed: {e.strerror}") from e
            finally:
                scratch.adopt("mds")  # MDSWriter's files, also after an interrupt
    finally:
        if scratch.leftovers:
            warn(
                "could not remove everything starvecheck created (it holds something "
                "else, or permissions changed): " + "; ".join(scratch.leftovers)
            )
    return sources, measured, scratch.path


class LoaderStage(BaseStage[LoaderOptions, OnDisk[Plan]]):
    """`loader` in the registry (stages/base.Stage)."""

    name = "loader"

    def plan(self, options: LoaderOptions, ctx: RunContext) -> OnDisk[Plan]:
        """`options` as the command parsed them (`path` checked); the machine's facts
        in `ctx`."""
        from starvecheck.scratch.directory import OR_EXISTING, space_problem
        from starvecheck.stages.samples import sources

        size = options.sample_size
        eff = ctx.effective_cpus
        n = options.samples or LoaderOptions.SAMPLES[options.existing][options.quick]
        path = options.path
        if not options.existing and (
            problem := space_problem(
                path, n, size, sources.space_needed(n, size), elsewhere=OR_EXISTING
            )
        ):
            raise UsageError(problem)
        plan = Plan(
            samples=n,
            sample_size=size,
            workers=options.workers or default_workers(eff),
            runs=options.runs,
            batch_size=options.batch_size or LoaderOptions.BATCH_SIZE,
            prefetch_factor=options.prefetch_factor,
            pin_memory=options.pin_memory,
            cold=options.cold,
            effective_cpus=eff,
        )
        return OnDisk(path, options.existing, plan)

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> OnDisk[Plan]:
        from starvecheck.scratch.directory import doctor_remedies, space_problem
        from starvecheck.stages.samples import sources

        eff = ctx.effective_cpus
        n = LoaderOptions.SAMPLES[False][quick]
        path = ctx.path or os.getcwd()
        need = sources.space_needed(n, workload.sample_size)
        if problem := space_problem(path, n, workload.sample_size, need, **doctor_remedies(quick)):
            raise UsageError(problem)
        workers = default_workers(eff)
        plan = Plan(
            samples=n,
            sample_size=workload.sample_size,
            workers=tuple(x for x in workers if x <= eff) if quick else workers,
            runs=LoaderOptions.runs,
            batch_size=workload.batch_size,
            # The storage link is io's cold read; with --quick the loader link is the
            # DataLoader itself, warm.
            cold=not quick,
            effective_cpus=eff,
            layouts=(workload.layout,),
            sample_delay_ms=ctx.slow_ms,
        )
        return OnDisk(path, False, plan)

    def measure(self, plan: OnDisk[Plan], ctx: RunContext) -> StageResult:
        """Measure and summarise: the curves alone (the recommended num_workers and the
        capacity at it are advice/loader's, made when the run is judged). SIGTERM/SIGHUP
        raise like Ctrl-C while this runs, and a DataLoader that delivers nothing within
        ctx.batch_timeout_s ends it: workers are shut down, Streaming's shared memory and
        the scratch data removed on every way out."""
        return _run(
            plan.path,
            plan.plan,
            plan.existing,
            ctx.storage,
            ctx.progress,
            ctx.warn,
            ctx.batch_timeout_s,
        )


STAGE = LoaderStage()
