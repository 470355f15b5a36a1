"""`io`: how fast this storage delivers training samples, per data layout, cold and warm.

Two modes:
- generated (default): the same samples written as one file per sample and as one
  contiguous shard, in a fresh scratch directory under PATH, then read three ways
  (small_files.random, shard.sequential, shard.random), cold and warm, with 1..N
  reader threads;
- existing (--existing): a sample of the user's own files (whole small files,
  byte ranges of large ones), read-only.

A run is only called cold when `mincore` says the data was not resident before
it; otherwise its figures are withheld with the reason (docs/architecture.md, principle 1).
"""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema import samples
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.io import IoFigures, Pattern, Place, Quantity, Reads
from starvecheck.core.schema.samples import Cache
from starvecheck.core.signals import check_signals, signals_raise
from starvecheck.core.status import Unavailable, UsageError
from starvecheck.probe.cpu import under_hypervisor
from starvecheck.scratch.directory import (
    OR_EXISTING,
    Scratch,
    doctor_remedies,
    space_problem,
    write_all,
)
from starvecheck.stages.base import BaseStage, OnDisk, RunContext
from starvecheck.stages.options import IoOptions, default_threads
from starvecheck.stages.samples import cache
from starvecheck.stages.samples import existing as existing_mode
from starvecheck.stages.samples.layouts import MB, Layout, Progress
from starvecheck.stages.samples.layouts import no_progress as _no_progress
from starvecheck.stages.samples.reads import FileOps, Ops, RangeOps, ReadError, RunResult, timed_run
from starvecheck.stages.samples.residency import judge_cache, record_residency
from starvecheck.stages.timing import (
    UNSTABLE_SPREAD,
    first_cold_slower,
    hypervisor_cache,
    outliers,
    percentile,
    too_few_runs,
)
from starvecheck.stages.timing import unstable as timing_unstable

if TYPE_CHECKING:
    from starvecheck.inputs.workload import Workload

# A first cold run this much slower than the later ones points to a cache below ours.
FIRST_COLD_SLOWER = 1.5


@dataclass(frozen=True)
class Plan:
    samples: int
    sample_size: int
    runs: int
    threads: tuple[int, ...]
    cold: bool = IoOptions.cold
    drop_caches: bool = False
    keep: bool = False
    seed: int = 0

    @property
    def temperatures(self) -> tuple[str, ...]:
        return ("cold", "warm") if self.cold else ("warm",)

    def parameters(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "sample_size_bytes": self.sample_size,
            "runs": self.runs,
            "threads": list(self.threads),
            "cold": self.cold,
            "drop_caches": self.drop_caches,
            "seed": self.seed,
        }


@dataclass
class Measured:
    """Raw results, kept for the metrics and the advice."""

    runs: dict[tuple[str, str, str, int], list[RunResult]] = field(default_factory=dict)
    resident_cold: dict[str, list[float | None]] = field(default_factory=dict)
    resident_warm: dict[str, list[float | None]] = field(default_factory=dict)
    residency_errors: list[str] = field(default_factory=list)


def generate(scratch: Scratch, plan: Plan, progress: Progress = _no_progress) -> list[Layout]:
    """Write the samples as one file each and as one shard; return both layouts."""
    scratch.mkdir("samples")
    names = [f"{i:07d}.bin" for i in range(plan.samples)]
    shard_fd = scratch.new_file("shard.bin")
    try:
        for i, name in enumerate(names):
            data = os.urandom(plan.sample_size)  # incompressible: no fs compression tricks
            scratch.write_file(name, data, "samples")
            write_all(shard_fd, data)
            if i % 256 == 0:
                progress("writing samples", i, plan.samples)
    finally:
        os.close(shard_fd)
    progress("writing samples", plan.samples, plan.samples)
    scratch.syncfs()

    rng = random.Random(plan.seed)
    shuffled = names[:]
    rng.shuffle(shuffled)
    size = plan.sample_size
    offsets = [(0, i * size, size) for i in range(plan.samples)]
    shuffled_offsets = offsets[:]
    rng.shuffle(shuffled_offsets)
    total = plan.samples * size
    return [
        Layout(
            "small_files",
            {"random": FileOps(shuffled, scratch.dir_fd("samples"))},
            names,
            scratch.dir_fd("samples"),
            total,
            size,
            sync=True,
        ),
        Layout(
            "shard",
            {
                "sequential": RangeOps(offsets, ["shard.bin"], scratch.dir_fd()),
                "random": RangeOps(shuffled_offsets, ["shard.bin"], scratch.dir_fd()),
            },
            ["shard.bin"],
            scratch.dir_fd(),
            total,
            size,
            sync=True,
        ),
    ]


def measure(layouts: Sequence[Layout], plan: Plan, progress: Progress = _no_progress) -> Measured:
    """Every (layout, pattern, temperature, threads) combination: warm-up, then runs."""
    out = Measured()
    configs = [
        (layout, pattern, temp, threads)
        for temp in plan.temperatures
        for layout in layouts
        for pattern in layout.ops
        for threads in plan.threads
    ]
    total_runs = len(configs) * plan.runs
    done = 0
    warmed: set[str] = set()
    for layout, pattern, temp, threads in configs:
        ops = layout.ops[pattern]
        contiguous = pattern == "sequential"
        if temp == "warm" and layout.name not in warmed:
            # Fill the page cache: one full read, unmeasured.
            timed_run(ops, threads=1, buffer_size=layout.buffer_size, contiguous=contiguous)
            out.resident_warm.setdefault(layout.name, []).append(
                record_residency(layout, out.residency_errors)
            )
            warmed.add(layout.name)
        # Warm-up: a slice of the same reads, unmeasured (first-touch costs: buffers,
        # thread start, code paths), then the measured runs.
        warm_up = _head(ops, max(1, min(len(ops) // 20, 256)))
        timed_run(warm_up, threads=threads, buffer_size=layout.buffer_size, contiguous=contiguous)
        results = out.runs.setdefault((layout.name, pattern, temp, threads), [])
        for _ in range(plan.runs):
            check_signals()
            if temp == "cold":
                _evict(layout, plan)
                out.resident_cold.setdefault(layout.name, []).append(
                    record_residency(layout, out.residency_errors)
                )
            progress(f"{layout.name}.{pattern} {temp}, {threads} thread(s)", done, total_runs)
            results.append(
                timed_run(
                    ops, threads=threads, buffer_size=layout.buffer_size, contiguous=contiguous
                )
            )
            done += 1
    progress("measuring", total_runs, total_runs)
    return out


def _head(ops: Ops, n: int) -> Ops:
    if isinstance(ops, FileOps):
        return FileOps(ops.names[:n], ops.dir_fd, ops.flags)
    return RangeOps(ops.ranges[:n], ops.files, ops.dir_fd, ops.flags)


def _evict(layout: Layout, plan: Plan) -> None:
    if plan.drop_caches:
        cache.drop_all_caches()
    cache.evict(layout.paths, dir_fd=layout.dir_fd, sync=layout.sync, flags=layout.evict_flags)


def metric_name(layout: str, pattern: str, temp: str, threads: int) -> str:
    return Place(samples.Layout(layout), Pattern(pattern), Cache(temp), threads).name


def summarize(
    layouts: Sequence[Layout], plan: Plan, m: Measured, fs_kind: str | None = None
) -> tuple[IoFigures, list[Caveat]]:
    """The figures and caveats from the raw runs. Cold figures of a layout that was not
    cold before its runs are withheld, with the reason."""
    residency, caveats, not_cold = judge_cache(
        [layout.name for layout in layouts],
        m,
        fs_kind,
        command="io",
        unit="run",
        fix="use --drop-caches as root, or more --samples than the memory holds",
    )
    reads: list[Reads] = []
    unstable: list[str] = []
    for (layout, pattern, temp, threads), runs in m.runs.items():
        place = Place(samples.Layout(layout), Pattern(pattern), Cache(temp), threads)
        name = place.name
        if temp == Cache.COLD and layout in not_cold:
            gone = Figure.missing(not_cold[layout])
            reads.append(Reads(place, gone, gone, gone, gone, gone))
            continue
        mbps = [r.bytes / r.seconds / MB for r in runs if r.seconds > 0]
        rate = Figure.repeated(r.ops / r.seconds for r in runs if r.seconds > 0)
        lat = sorted(x for r in runs for x in r.latencies_ns)
        none = Figure.missing("no reads completed")
        p50, p90, p99 = (
            Figure.single(percentile(lat, p) / 1e6) if lat else none for p in (50, 90, 99)
        )
        reads.append(Reads(place, Figure.repeated(mbps), rate, p50, p90, p99))
        if temp == Cache.COLD and len(mbps) >= 3:
            rest = statistics.median(mbps[1:])
            if mbps[0] * FIRST_COLD_SLOWER < rest:
                caveats.append(first_cold_slower(name, mbps[0], rest))
        if len(mbps) >= 2 and statistics.median(mbps) > 0:
            spread = statistics.stdev(mbps) / statistics.median(mbps)
            if spread >= UNSTABLE_SPREAD or outliers(mbps):
                unstable.append(f"{name} {spread:.0%}")
    if unstable:
        caveats.append(timing_unstable(unstable, "runs"))
    if plan.runs < 3:
        caveats.append(
            too_few_runs(
                f"only {plan.runs} run(s) per pattern: too few to judge the spread; "
                "`starvecheck io --runs 3` or more"
            )
        )
    return IoFigures(tuple(residency), tuple(reads)), caveats


def _generate_and_measure(
    path: str, plan: Plan, ctx: RunContext
) -> tuple[list[Layout], Measured, str]:
    """Write the samples in a fresh scratch directory under `path`, measure, and
    remove it (unless --keep); what could not be removed is a warning."""
    scratch = Scratch(path, prefix="starvecheck-io-", keep=plan.keep, warn=ctx.warn)
    try:
        with scratch:
            try:
                layouts = generate(scratch, plan, ctx.progress)
            except OSError as e:
                raise UsageError(f"writing test data in {scratch.path} failed: {e.strerror}") from e
            measured = _measure_or_fail(layouts, plan, ctx.progress)
    finally:
        if scratch.leftovers:
            ctx.warn(
                "could not remove everything starvecheck created (it holds something "
                "else, or permissions changed): " + "; ".join(scratch.leftovers)
            )
    return layouts, measured, scratch.path


def _cache_caveats(figures: IoFigures, plan: Plan) -> list[Caveat]:
    """What `cold` could not cover: a hypervisor's cache, and file metadata."""
    caveats: list[Caveat] = []
    cold_small = any(
        r.mb_per_s is not None and r.mb_per_s.value is not None
        for layout in (samples.Layout.SMALL_FILES, samples.Layout.FILES)
        if (r := figures.at(Place(layout, Pattern.RANDOM, Cache.COLD))) is not None
    )
    if plan.cold and under_hypervisor():
        caveats.append(
            hypervisor_cache(
                "this is a virtual machine: cold means evicted from this kernel's page "
                "cache, but the hypervisor may cache the virtual disk (virtio "
                "cache=writeback), which makes cold reads faster than the physical device"
            )
        )
    if cold_small and not plan.drop_caches:
        caveats.append(
            Caveat(
                "io.metadata-cached",
                "cold means the data's pages were evicted; file metadata (inodes, directory "
                "entries) stays cached, so a first epoch on a fresh node opens files slower "
                "still (--drop-caches, as root, drops it too)",
            )
        )
    return caveats


def _capacity(figures: IoFigures, layouts: Sequence[Layout], plan: Plan) -> Metric | None:
    """The user's own files (--existing): samples/s of the first layout at the most
    readers, cold where measured, else warm."""
    layout = samples.Layout(layouts[0].name)
    for temp in plan.temperatures:
        reads = figures.at(Place(layout, Pattern.RANDOM, Cache(temp), max(plan.threads)))
        m = None if reads is None else reads.metric(Quantity.SAMPLES_PER_S)
        if m is not None and m.value:
            return replace(m, name=f"capacity ({m.name})")
    return None


def _measure_or_fail(layouts: Sequence[Layout], plan: Plan, progress: Progress) -> Measured:
    try:
        return measure(layouts, plan, progress)
    except ReadError as e:
        raise Unavailable(f"a read failed during the measurement: {e}") from e
    except OSError as e:
        where = f" ({os.fsdecode(e.filename)})" if e.filename else ""
        raise Unavailable(f"I/O error during the measurement{where}: {e.strerror}") from e


class IoStage(BaseStage[IoOptions, OnDisk[Plan]]):
    """`io` in the registry (stages/base.Stage)."""

    name = "io"

    def plan(self, options: IoOptions, ctx: RunContext) -> OnDisk[Plan]:
        """`options` as the command parsed them; `path` already checked (args.data_path)
        and the machine's facts in `ctx` collected for it."""
        existing, cold, drop_caches = options.existing, options.cold, options.drop_caches
        if options.keep and existing:
            raise UsageError(
                "--keep: nothing is written with --existing, so there is nothing to keep"
            )
        if drop_caches and not cold:
            raise UsageError("--drop-caches only applies to cold runs; drop --no-cold or it")
        if drop_caches and (problem := cache.drop_caches_problem()):
            raise UsageError(f"--drop-caches: {problem}")
        size = options.sample_size
        n = options.samples or IoOptions.SAMPLES[existing][options.quick]
        path = options.path
        if not existing and (problem := space_problem(path, n, size, elsewhere=OR_EXISTING)):
            raise UsageError(problem)
        eff = ctx.effective_cpus
        return OnDisk(
            path,
            existing,
            Plan(
                samples=n,
                sample_size=size,
                runs=options.runs or IoOptions.RUNS[options.quick],
                threads=options.threads or default_threads(eff),
                cold=cold,
                drop_caches=drop_caches,
                keep=options.keep,
            ),
        )

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> OnDisk[Plan]:
        n, runs = IoOptions.SAMPLES[False][quick], IoOptions.RUNS[quick]
        path = ctx.path or os.getcwd()
        if problem := space_problem(path, n, workload.sample_size, **doctor_remedies(quick)):
            raise UsageError(problem)
        eff = ctx.effective_cpus
        plan = Plan(
            samples=n,
            sample_size=workload.sample_size,
            runs=runs,
            threads=default_threads(eff),
        )
        return OnDisk(path, False, plan)

    def measure(self, plan: OnDisk[Plan], ctx: RunContext) -> StageResult:
        """Measure and summarise (judging is advice/io's). SIGTERM/SIGHUP raise like
        Ctrl-C while this runs, so the scratch data is removed on every way out."""
        path, p = plan.path, plan.plan
        params: dict[str, Any] = {"path": path, **p.parameters()}
        caveats: list[Caveat] = []
        with signals_raise():
            if plan.existing:
                layouts, extra, caveats = existing_mode.layouts(path, p)
                params.update(extra)
                if not layouts:
                    raise UsageError(f"{path}: no readable, non-empty regular files to sample")
                measured = _measure_or_fail(layouts, p, ctx.progress)
            else:
                layouts, measured, scratch_path = _generate_and_measure(path, p, ctx)
                params["scratch"] = scratch_path
                if p.keep:
                    caveats.append(
                        Caveat(
                            "io.kept",
                            f"test data kept in {scratch_path} (--keep); remove it with rm -r",
                        )
                    )
        figures, more = summarize(layouts, p, measured, ctx.storage.get("kind"))
        caveats += more
        caveats += _cache_caveats(figures, p)
        return StageResult(
            stage="io",
            parameters=params,
            metrics=figures.to_metrics(),
            caveats=tuple(caveats),
            capacity=_capacity(figures, layouts, p) if plan.existing else None,
        )


STAGE = IoStage()
