"""`io`: how fast this storage delivers training samples, per data layout, cold and warm.

Two modes:
- generated (default): the same samples written as one file per sample and as one
  contiguous shard, in a fresh scratch directory under PATH, then read three ways
  (small_files.random, shard.sequential, shard.random), cold and warm, with 1..N
  reader threads;
- existing (--existing): a sample of the user's own files (whole small files,
  byte ranges of large ones), read-only.

A run is only called cold when `mincore` says the data was not resident before
it; otherwise its figures are withheld with the reason (DESIGN.md, principle 1).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from starvecheck import cache
from starvecheck.model import Metric, StageResult
from starvecheck.scratch import Scratch, check_signals, signals_raise, write_all
from starvecheck.stages.reads import FileOps, Ops, RangeOps, ReadError, RunResult, timed_run
from starvecheck.status import Unavailable, UsageError
from starvecheck.timing import UNSTABLE_SPREAD, outliers, percentile
from starvecheck.units import format_bytes

# A cold run is cold when at most this share of its data was resident before it.
COLD_MAX_RESIDENT = 0.05
# A warm run is warm when at least this share was resident (less: data > page cache).
WARM_MIN_RESIDENT = 0.95
MB = 1e6  # MB/s as fio and dd print it: 10^6 bytes
# A first cold run this much slower than the later ones points to a cache below ours.
FIRST_COLD_SLOWER = 1.5

# Free space starvecheck leaves untouched on the filesystem it writes to.
MARGIN_BYTES = 256 << 20
MARGIN_SHARE = 0.10
BLOCK = 4096

Progress = Callable[[str, int, int], None]  # (what, done, total)

# (samples, runs) by default and with --quick (SIZES[quick][mode]), for `io` and
# `doctor`; existing mode reads real files, fewer by default (each may be large, and
# the storage may be remote).
SIZES = {
    False: {"generated": (10_000, 5), "existing": (1_000, 5)},
    True: {"generated": (2_000, 3), "existing": (200, 3)},
}


def _no_progress(what: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True)
class Plan:
    samples: int
    sample_size: int
    runs: int
    threads: tuple[int, ...]
    cold: bool = True
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


def space_needed(samples: int, sample_size: int) -> int:
    """Bytes the generated data takes: every sample twice (its own file and the
    shard), each small file rounded up to whole blocks."""
    per_file = -(-sample_size // BLOCK) * BLOCK
    return samples * per_file + samples * sample_size + BLOCK * (samples // 64 + 4)


def space_problem(path: str, samples: int, sample_size: int, need: int | None = None) -> str | None:
    """Why the data cannot be written under `path`, or None. `need`: bytes the data
    takes, where not io's own layouts (`space_needed`)."""
    need = space_needed(samples, sample_size) if need is None else need
    margin = MARGIN_BYTES + int(need * MARGIN_SHARE)
    try:
        st = os.statvfs(path)
    except OSError as e:
        return f"cannot read free space of {path}: {e.strerror}"
    free = st.f_bavail * st.f_frsize
    if free < need + margin:
        return (
            f"{path}: not enough free space: the test data needs {format_bytes(need)} plus a "
            f"{format_bytes(margin)} margin, {format_bytes(free)} is free; use fewer --samples "
            "or a smaller --sample-size"
        )
    if st.f_files and st.f_favail < samples + 16:  # f_files 0: no inode limit (btrfs, ...)
        return f"{path}: not enough free inodes: {samples + 16:,} needed, {st.f_favail:,} free"
    return None


@dataclass
class Layout:
    """One way the samples sit on disk, and how to evict and check it."""

    name: str  # small_files, shard, files, ranges
    ops: dict[str, Ops]  # access pattern -> what to read, in order
    paths: list[str]  # every file of the layout (for eviction and mincore)
    dir_fd: int | None
    bytes: int
    buffer_size: int
    sync: bool  # fsync before evicting: only for files starvecheck wrote
    evict_flags: int = os.O_RDONLY
    # Where only byte ranges of big files are read, residency is checked on those
    # ranges ((file index, offset, length)); otherwise on whole files.
    ranges: Sequence[tuple[int, int, int]] | None = None

    def residency(self) -> cache.Residency:
        if self.ranges is None:
            return cache.residency(self.paths, dir_fd=self.dir_fd, flags=self.evict_flags)
        total = cache.Residency(0, 0)
        by_file: dict[int, list[tuple[int, int]]] = {}
        for index, offset, length in self.ranges:
            by_file.setdefault(index, []).append((offset, length))
        for index, spans in by_file.items():
            try:
                fd = os.open(
                    self.paths[index], self.evict_flags | os.O_NOFOLLOW, dir_fd=self.dir_fd
                )
            except OSError as e:
                total = total + cache.Residency(0, 0, 1, f"{self.paths[index]}: {e.strerror}")
                continue
            try:
                for offset, length in spans:
                    total = total + cache.residency_fd(fd, offset, length)
            finally:
                os.close(fd)
        return total


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


def record_residency(layout: Layout, errors: list[str]) -> float | None:
    """The layout's resident fraction; why it could not be read goes to `errors`, once."""
    res = layout.residency()
    if res.reason and res.reason not in errors:
        errors.append(res.reason)
    return res.fraction


class CacheRecord(Protocol):
    resident_cold: dict[str, list[float | None]]
    resident_warm: dict[str, list[float | None]]
    residency_errors: list[str]


def judge_cache(
    names: Sequence[str],
    m: CacheRecord,
    fs_kind: str | None,
    *,
    command: str,
    unit: str,
    fix: str,
) -> tuple[list[Metric], list[str], dict[str, str]]:
    """What the residency checks say, for io and loader alike: `resident_before.<name>`
    metrics, caveats, and the layouts whose cold figures must be withheld (with the
    reason). `unit` is what one measurement is called ("run", "epoch"); `fix` what to
    do where the cache could not be emptied."""
    metrics: list[Metric] = []
    caveats: list[str] = []
    not_cold: dict[str, str] = {}
    for name in names:
        fractions = m.resident_cold.get(name, [])
        known = [f for f in fractions if f is not None]
        if known:
            metrics.append(resident_metric(f"resident_before.{name}", known))
            if max(known) > COLD_MAX_RESIDENT:
                not_cold[name] = (
                    f"not cold: {max(known):.0%} of the data was still in the page cache "
                    f"before a cold {unit}"
                )
        elif fractions:
            caveats.append(
                f"{name}: could not check that the cache was cold "
                f"({'; '.join(m.residency_errors) or 'mincore failed'}); "
                "compare the cold and warm figures before trusting the cold ones"
            )
        warm = [f for f in m.resident_warm.get(name, []) if f is not None]
        if warm and min(warm) < WARM_MIN_RESIDENT:
            caveats.append(
                f"{name}: only {min(warm):.0%} of the data stayed in the page cache "
                "after a full read, so the warm figures are partly cold (the data is larger "
                "than the memory the page cache can use)"
            )
    if not_cold and fs_kind == "memory":
        caveats.append(
            f"this path is on tmpfs (memory), where data cannot be cold: the cold figures of "
            f"{', '.join(sorted(not_cold))} are withheld; run {command} on the filesystem "
            "the dataset really lives on"
        )
    elif not_cold:
        caveats.append(
            f"the page cache could not be emptied for {', '.join(sorted(not_cold))}: the "
            f"cold figures would have been warm ones and are withheld. {fix[0].upper()}"
            f"{fix[1:]}"
        )
    return metrics, caveats, not_cold


def metric_name(layout: str, pattern: str, temp: str, threads: int) -> str:
    return f"{layout}.{pattern}.{temp}" + (f".t{threads}" if threads > 1 else "")


def summarize(
    layouts: Sequence[Layout], plan: Plan, m: Measured, fs_kind: str | None = None
) -> tuple[list[Metric], list[str]]:
    """Metrics and caveats from the raw runs. Cold figures of a layout that was not
    cold before its runs are withheld, with the reason."""
    metrics, caveats, not_cold = judge_cache(
        [layout.name for layout in layouts],
        m,
        fs_kind,
        command="io",
        unit="run",
        fix="use --drop-caches as root, or more --samples than the memory holds",
    )
    unstable: list[str] = []
    for (layout, pattern, temp, threads), runs in m.runs.items():
        name = metric_name(layout, pattern, temp, threads)
        if temp == "cold" and layout in not_cold:
            reason = not_cold[layout]
            metrics.append(Metric.missing(name, "MB/s", reason))
            metrics.append(Metric.missing(f"{name}.samples_per_s", "samples/s", reason))
            for p in ("p50", "p90", "p99"):
                metrics.append(Metric.missing(f"{name}.{p}_ms", "ms", reason))
            continue
        mbps = [r.bytes / r.seconds / MB for r in runs if r.seconds > 0]
        metrics.append(Metric.repeated(name, mbps, "MB/s"))
        metrics.append(
            Metric.repeated(
                f"{name}.samples_per_s",
                [r.ops / r.seconds for r in runs if r.seconds > 0],
                "samples/s",
            )
        )
        lat = sorted(x for r in runs for x in r.latencies_ns)
        for p in (50, 90, 99):
            if lat:
                metrics.append(Metric.single(f"{name}.p{p}_ms", percentile(lat, p) / 1e6, "ms"))
            else:
                metrics.append(Metric.missing(f"{name}.p{p}_ms", "ms", "no reads completed"))
        if temp == "cold" and len(mbps) >= 3:
            rest = statistics.median(mbps[1:])
            if mbps[0] * FIRST_COLD_SLOWER < rest:
                caveats.append(
                    f"{name}: the first cold run read at {mbps[0]:,.0f} MB/s, later ones at "
                    f"{rest:,.0f}: a cache below this kernel (hypervisor, storage array, "
                    "NFS server) kept the data after the first read, so the median is "
                    "optimistic for a first epoch"
                )
        if len(mbps) >= 2 and statistics.median(mbps) > 0:
            spread = statistics.stdev(mbps) / statistics.median(mbps)
            if spread >= UNSTABLE_SPREAD or outliers(mbps):
                unstable.append(f"{name} {spread:.0%}")
    if unstable:
        caveats.append(
            "runs vary by 10% or more of the median (stdev/median), or hold outliers: "
            + ", ".join(unstable)
            + "; a noisy machine or a cache changing under the runs: close other work and "
            "add --runs"
        )
    if plan.runs < 3:
        caveats.append(
            f"only {plan.runs} run(s) per pattern: too few to judge the spread; use --runs 3 "
            "or more"
        )
    return metrics, caveats


def resident_metric(name: str, fractions: list[float]) -> Metric:
    """The largest fraction seen (the figure that decides), every value kept."""
    m = Metric.repeated(name, [round(f, 6) for f in fractions], "fraction")
    return replace(m, value=m.max)


def run(
    path: str,
    plan: Plan,
    *,
    existing: bool,
    storage: dict[str, Any],
    progress: Progress = _no_progress,
    warn: Callable[[str], None] = lambda _msg: None,
) -> StageResult:
    """Measure, summarise and judge. SIGTERM/SIGHUP raise like Ctrl-C while this runs,
    so the scratch data is removed on every way out."""
    from starvecheck.advice.io import advise

    start = time.perf_counter()
    params: dict[str, Any] = {"path": path, **plan.parameters()}
    caveats: list[str] = []
    with signals_raise():
        if existing:
            from starvecheck.stages import existing as existing_mode

            layouts, extra, caveats = existing_mode.layouts(path, plan)
            params.update(extra)
            if not layouts:
                raise UsageError(f"{path}: no readable, non-empty regular files to sample")
            measured = _measure_or_fail(layouts, plan, progress)
        else:
            scratch = Scratch(path, prefix="starvecheck-io-", keep=plan.keep)
            try:
                with scratch:
                    try:
                        layouts = generate(scratch, plan, progress)
                    except OSError as e:
                        raise UsageError(
                            f"writing test data in {scratch.path} failed: {e.strerror}"
                        ) from e
                    measured = _measure_or_fail(layouts, plan, progress)
            finally:
                if scratch.leftovers:
                    warn(
                        "could not remove everything starvecheck created (it holds something "
                        "else, or permissions changed): " + "; ".join(scratch.leftovers)
                    )
            params["scratch"] = scratch.path
            if plan.keep:
                caveats.append(f"test data kept in {scratch.path} (--keep); remove it with rm -r")
    metrics, more = summarize(layouts, plan, measured, storage.get("kind"))
    caveats += more
    cold_small = any(
        x.value is not None and x.name in ("small_files.random.cold", "files.random.cold")
        for x in metrics
    )
    if plan.cold and under_hypervisor():
        caveats.append(
            "this is a virtual machine: cold means evicted from this kernel's page cache, "
            "but the hypervisor may cache the virtual disk (virtio cache=writeback), which "
            "makes cold reads faster than the physical device"
        )
    if cold_small and not plan.drop_caches:
        caveats.append(
            "cold means the data's pages were evicted; file metadata (inodes, directory "
            "entries) stays cached, so a first epoch on a fresh node opens files slower "
            "still (--drop-caches, as root, drops it too)"
        )
    capacity = None
    if existing:
        layout = layouts[0].name
        n = max(plan.threads)
        for temp in plan.temperatures:
            name = metric_name(layout, "random", temp, n) + ".samples_per_s"
            m = next((x for x in metrics if x.name == name and x.value), None)
            if m is not None:
                capacity = replace(m, name=f"capacity ({name})")
                break
    return StageResult(
        stage="io",
        parameters=params,
        metrics=tuple(metrics),
        findings=advise(metrics, params, storage),
        caveats=tuple(caveats),
        capacity=capacity,
        duration_s=round(time.perf_counter() - start, 3),
    )


def under_hypervisor() -> bool:
    from starvecheck.probe.cpu import parse_hypervisor
    from starvecheck.sysroot import SysRoot

    text = SysRoot.from_environ({}).read("/proc/cpuinfo")
    return bool(text.known and parse_hypervisor(text.value or ""))


def _measure_or_fail(layouts: Sequence[Layout], plan: Plan, progress: Progress) -> Measured:
    try:
        return measure(layouts, plan, progress)
    except ReadError as e:
        raise Unavailable(f"a read failed during the measurement: {e}") from e
    except OSError as e:
        where = f" ({os.fsdecode(e.filename)})" if e.filename else ""
        raise Unavailable(f"I/O error during the measurement{where}: {e.strerror}") from e
