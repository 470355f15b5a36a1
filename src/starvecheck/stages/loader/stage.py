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
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.signals import check_signals, importing, signals_held, signals_raise
from starvecheck.core.status import Unavailable, UsageError
from starvecheck.probe.cpu import under_hypervisor
from starvecheck.scratch.directory import Scratch
from starvecheck.stages.base import BaseStage, OnDisk, RunContext
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S, Batches
from starvecheck.stages.dataloader.workers import prepare_workers, quiet_torch, worker_init
from starvecheck.stages.options import LoaderOptions, default_workers
from starvecheck.stages.samples import cache
from starvecheck.stages.samples.datasets import batch_size_of
from starvecheck.stages.samples.layouts import MB, Progress
from starvecheck.stages.samples.mds import streaming_or_why
from starvecheck.stages.samples.plan import Plan
from starvecheck.stages.samples.reads import FileOps, timed_run
from starvecheck.stages.samples.residency import judge_cache, record_residency
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

# Batches read in this process before measuring each layout (first-use costs).
WARMUP_BATCHES = 4


def _no_progress(what: str, done: int, total: int) -> None:
    pass


# --- the steady-state window (pure) ----------------------------------------------------


def steady(
    started: float, arrivals: Sequence[float], workers: int, prefetch: int
) -> tuple[int, float]:
    """The loader once running: (index of the first batch counted, seconds). Counting
    starts after the batch that empties the queue filled during start-up (1 + workers
    x prefetch batches) and ends at the last arrival. Short epochs keep at least their
    second half; a one-batch epoch counts from `started`."""
    n = len(arrivals)
    skip = max(0, min(1 + workers * prefetch, n // 2))
    if n == 0:
        return 0, 0.0
    return skip, arrivals[-1] - (arrivals[skip - 1] if skip else started)


# --- measuring -------------------------------------------------------------------------


@dataclass(frozen=True)
class Epoch:
    seconds: float  # steady state (see `steady`)
    steady_samples: int
    steady_bytes: int
    first_batch_s: float
    waits_s: tuple[float, ...]  # every batch after the first


@dataclass
class Measured:
    epochs: dict[tuple[str, str, int], list[Epoch]] = field(default_factory=dict)
    resident_cold: dict[str, list[float | None]] = field(default_factory=dict)
    resident_warm: dict[str, list[float | None]] = field(default_factory=dict)
    residency_errors: list[str] = field(default_factory=list)


def run_epoch(
    source: Source,
    plan: Plan,
    workers: int,
    pin_memory: bool,
    run: int,
    limit: int = 0,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Epoch:
    """One epoch (or `limit` batches) through a fresh DataLoader, each batch within
    `batch_timeout_s` (stages/dataloader/batches.py; 0: no limit). Workers are shut down and the
    dataset released on every way out, Ctrl-C and a stuck worker included."""
    with importing():
        import torch

    clock = time.perf_counter
    dataset = None
    try:
        with signals_held():  # the dataset exists only once it can be released
            dataset = source.make(run)
        if workers:
            prepare_workers()
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=plan.batch_size,
            shuffle=source.shuffle,
            num_workers=workers,
            collate_fn=source.collate,
            pin_memory=pin_memory,
            prefetch_factor=plan.prefetch_factor if workers else None,
            persistent_workers=False,
            worker_init_fn=worker_init if workers else None,
            generator=torch.Generator().manual_seed(plan.seed + run),
        )
        arrivals: list[float] = []
        waits: list[float] = []  # time blocked in next(it), every batch after the first
        counts: list[int] = []
        sizes: list[int] = []
        # The testing hook's delay (STARVECHECK_SLOW_RANKS) comes on top of the limit.
        delay_s = plan.batch_size * plan.sample_delay_ms / 1e3
        timeout = batch_timeout_s + delay_s if batch_timeout_s else 0.0
        started = clock()
        with Batches(loader, timeout, "loader", source.name) as it:
            while not limit or len(arrivals) < limit:
                check_signals()  # an interrupt swallowed while forking workers
                asked = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                arrivals.append(clock())
                if len(arrivals) > 1:
                    waits.append(arrivals[-1] - asked)
                n, nbytes = batch_size_of(batch)
                counts.append(n)
                sizes.append(nbytes)
    finally:
        if dataset is not None:
            with signals_held():
                source.release(dataset)
    skip, seconds = steady(started, arrivals, workers, plan.prefetch_factor)
    return Epoch(
        seconds=seconds,
        steady_samples=sum(counts[skip:]),
        steady_bytes=sum(sizes[skip:]),
        first_batch_s=(arrivals[0] - started) if arrivals else 0.0,
        waits_s=tuple(waits),
    )


def measure(
    sources: Sequence[Source],
    plan: Plan,
    pin_memory: bool,
    progress: Progress = _no_progress,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Measured:
    """Every (cache, layout, num_workers): `plan.runs` epochs, each cold one evicted
    and checked first; warm ones after a full unmeasured read."""
    out = Measured()
    for source in sources:  # first-use costs (imports, code paths) out of the figures
        run_epoch(source, plan, 0, pin_memory, 0, WARMUP_BATCHES, batch_timeout_s)
    configs = [(t, s, w) for t in plan.temperatures for s in sources for w in plan.workers]
    total = len(configs) * plan.runs
    done = 0
    warmed: set[str] = set()
    for temp, source, workers in configs:
        layout = source.layout
        if temp == "warm" and layout.name not in warmed:
            files = FileOps(layout.paths, layout.dir_fd, layout.evict_flags)
            timed_run(files, threads=1, buffer_size=1 << 20, contiguous=True)
            out.resident_warm.setdefault(layout.name, []).append(
                record_residency(layout, out.residency_errors)
            )
            warmed.add(layout.name)
        epochs = out.epochs.setdefault((layout.name, temp, workers), [])
        for run in range(plan.runs):
            if temp == "cold":
                cache.evict(
                    layout.paths, dir_fd=layout.dir_fd, sync=layout.sync, flags=layout.evict_flags
                )
                out.resident_cold.setdefault(layout.name, []).append(
                    record_residency(layout, out.residency_errors)
                )
            progress(f"{layout.name} {temp}, {workers} worker(s)", done, total)
            epochs.append(run_epoch(source, plan, workers, pin_memory, run, 0, batch_timeout_s))
            done += 1
    progress("measuring", total, total)
    return out


# --- summarising -------------------------------------------------------------------------


def summarize(
    names: Sequence[str], plan: Plan, m: Measured, fs_kind: str | None = None
) -> tuple[list[Metric], list[str], dict[str, str]]:
    """Metrics (named as the README promises), caveats, and the cache state each
    layout's first_batch_s comes from."""
    metrics, caveats, not_cold = judge_cache(
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
    for name in names:
        for temp in plan.temperatures:
            for w in plan.workers:
                epochs = m.epochs.get((name, temp, w), [])
                base = f"{name}.{temp}.w{w}"
                where = {"layout": name, "cache": temp, "workers": w}
                rate_l = {"quantity": "samples_per_s", **where}
                mbps_l = {"quantity": "mb_per_s", **where}
                wait_l = {p: {"quantity": f"batch_wait_p{p}_ms", **where} for p in (50, 99)}
                if temp == "cold" and name in not_cold:
                    reason = not_cold[name]
                    metrics += [
                        Metric.missing(f"throughput.{base}", "samples/s", reason, rate_l),
                        Metric.missing(f"mbps.{base}", "MB/s", reason, mbps_l),
                        Metric.missing(f"batch_wait_ms.{base}.p50", "ms", reason, wait_l[50]),
                        Metric.missing(f"batch_wait_ms.{base}.p99", "ms", reason, wait_l[99]),
                    ]
                    continue
                rates = [e.steady_samples / e.seconds for e in epochs if e.seconds > 0]
                metrics.append(Metric.repeated(f"throughput.{base}", rates, "samples/s", rate_l))
                metrics.append(
                    Metric.repeated(
                        f"mbps.{base}",
                        [e.steady_bytes / e.seconds / MB for e in epochs if e.seconds > 0],
                        "MB/s",
                        mbps_l,
                    )
                )
                waits = sorted(x * 1000 for e in epochs for x in e.waits_s)
                for p in (50, 99):
                    name_p = f"batch_wait_ms.{base}.p{p}"
                    none = "one batch per epoch: no waits after it"
                    metrics.append(
                        Metric.single(name_p, round(percentile(waits, p), 4), "ms", wait_l[p])
                        if waits
                        else Metric.missing(name_p, "ms", none, wait_l[p])
                    )
                if len(rates) >= 2 and statistics.median(rates) > 0:
                    spread = statistics.stdev(rates) / statistics.median(rates)
                    if spread >= UNSTABLE_SPREAD or outliers(rates):
                        unstable.append(f"{base} {spread:.0%}")
        # Start-up is a property of the workers, not the cache: one figure per count,
        # from the cold epochs where they count, else the warm ones.
        temp = "cold" if plan.cold and name not in not_cold else "warm"
        first_cache[name] = temp
        for w in plan.workers:
            metrics.append(
                Metric.repeated(
                    f"first_batch_s.{name}.w{w}",
                    [round(e.first_batch_s, 5) for e in m.epochs.get((name, temp, w), [])],
                    "s",
                    {"quantity": "first_batch_s", "layout": name, "workers": w},
                )
            )
    if unstable:
        caveats.append(timing_unstable(unstable, "epochs"))
    if plan.runs < 3:
        caveats.append(
            too_few_runs(
                f"{plan.runs} epoch(s) per point: too few to judge the spread; use --runs 3 or more"
            )
        )
    return metrics, caveats, first_cache


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

    with importing():
        import torch

    from starvecheck.stages.dataloader import preflight

    sample = (1 << 20) if existing else plan.sample_size  # existing: files up to 8 MiB, most small
    plan = preflight.fitted(plan, plan.batch_size * sample, plan.prefetch_factor, warn)
    start = time.perf_counter()
    params: dict[str, Any] = {"path": path, **plan.parameters()}
    caveats: list[str] = []
    extra_metrics: list[Metric] = []
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
            measured = _measure_or_fail(sources, plan, pin, progress, batch_timeout_s)
        else:
            streaming, why = streaming_or_why() if plan.wants("mds") else (None, "")
            if streaming is None and plan.wants("mds"):
                extra_metrics.append(
                    Metric.missing(
                        "throughput.mds",
                        "samples/s",
                        why,
                        {"quantity": "samples_per_s", "layout": "mds"},
                    )
                )
            scratch = Scratch(path, prefix="starvecheck-loader-", warn=warn)
            try:
                with scratch:
                    try:
                        sources = generate(scratch, plan, streaming, progress)
                        measured = _measure_or_fail(sources, plan, pin, progress, batch_timeout_s)
                    except OSError as e:
                        raise UsageError(
                            f"writing test data in {scratch.path} failed: {e.strerror}"
                        ) from e
                    finally:
                        scratch.adopt("mds")  # MDSWriter's files, also after an interrupt
            finally:
                if scratch.leftovers:
                    warn(
                        "could not remove everything starvecheck created (it holds something "
                        "else, or permissions changed): " + "; ".join(scratch.leftovers)
                    )
            params["scratch"] = scratch.path
    names = [s.name for s in sources]
    metrics, more, first_cache = summarize(names, plan, measured, storage.get("kind"))
    caveats += more
    params["first_batch_cache"] = first_cache
    metrics += extra_metrics
    if plan.cold and under_hypervisor():
        caveats.append(hypervisor_cache("loader"))
    return StageResult(
        stage="loader",
        parameters=params,
        metrics=tuple(metrics),
        caveats=tuple(caveats),
        duration_s=round(time.perf_counter() - start, 3),
    )


def _measure_or_fail(
    sources: Sequence[Source], plan: Plan, pin: bool, progress: Progress, batch_timeout_s: float
) -> Measured:
    try:
        return measure(sources, plan, pin, progress, batch_timeout_s)
    except OSError as e:
        where = f" ({os.fsdecode(e.filename)})" if e.filename else ""
        raise Unavailable(f"I/O error during the measurement{where}: {e.strerror}") from e
    except RuntimeError as e:
        # torch reports a worker killed by a signal (out of memory, a bus error when
        # /dev/shm is full) as a RuntimeError: say so in one line.
        raise Unavailable(f"the DataLoader failed: {' '.join(str(e).split())}") from e


class LoaderStage(BaseStage[LoaderOptions, OnDisk[Plan]]):
    """`loader` in the registry (stages/base.Stage)."""

    name = "loader"

    def plan(self, options: LoaderOptions, ctx: RunContext) -> OnDisk[Plan]:
        """`options` as the command parsed them (`path` checked); the machine's facts
        in `ctx`."""
        from starvecheck.scratch.directory import space_problem
        from starvecheck.stages.samples import sources

        size = options.sample_size
        eff = ctx.effective_cpus
        n = options.samples or LoaderOptions.SAMPLES[options.existing][options.quick]
        path = options.path
        if not options.existing and (
            problem := space_problem(path, n, size, sources.space_needed(n, size))
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
        from starvecheck.scratch.directory import space_problem
        from starvecheck.stages.samples import sources

        eff = ctx.effective_cpus
        n = LoaderOptions.SAMPLES[False][quick]
        path = ctx.path or os.getcwd()
        need = sources.space_needed(n, workload.sample_size)
        if problem := space_problem(path, n, workload.sample_size, need):
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
