"""Judging `io` results: small-files penalty, cold-cache gap, reader concurrency,
and the storage under the data (network, rotational).

Every check reads the run as its record (core/schema/io.IoFigures, read from the
metrics by their labels), so it works the same on a fresh run and on a stored report. Ratios compare
figures measured in the same run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from starvecheck.advice.workers import Cpus, Throughput, recommend_workers
from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult
from starvecheck.core.schema.io import IoFigures, Parameters, Pattern, Place, Quantity
from starvecheck.core.schema.samples import Cache, Layout

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

# A layout change worth making: the sharded read is this much faster.
SMALL_FILES_WARNING = 1.5
SMALL_FILES_CRITICAL = 4.0
# Warm over cold: above this, a benchmark on a warm cache misleads.
COLD_GAP_NOTE = 1.5
# N readers over one: above this, concurrency hides the storage's latency.
READERS_NOTE = 1.5
# A cold small read slower than this at the median looks like a seek.
SEEK_MS = 2.0

SHARDING = (
    "Pack samples into shards of 64-256 MB and read them sequentially with a shuffle "
    "buffer: MosaicML Streaming (`MDSWriter(out=..., columns=...)`, then "
    "`StreamingDataset(local=..., shuffle=True)`) or WebDataset tar shards "
    "(`wds.WebDataset(urls).shuffle(1000)`)."
)


def _value(
    r: StageResult,
    layout: Layout,
    pattern: Pattern,
    cache: Cache,
    quantity: Quantity = Quantity.MB_PER_S,
    threads: int = 1,
) -> float | None:
    """A figure of one read pattern; None when missing or zero."""
    reads = r.records(IoFigures).at(Place(layout, pattern, cache, threads))
    figure = None if reads is None else reads.figure(quantity)
    v = None if figure is None else figure.value
    return v if v else None


def _best(r: StageResult, layout: Layout, pattern: Pattern) -> tuple[Cache, float] | None:
    """The cold MB/s of a pattern, else the warm one (said in the evidence)."""
    for temp in Cache:
        v = _value(r, layout, pattern, temp)
        if v is not None:
            return temp, v
    return None


def rules(results: Results) -> list[Finding]:
    """io's findings: the layouts, the cache, the readers from its own figures; the
    storage under the data from this machine's facts (none for a stored trace)."""
    r = results.get("io")
    if r is None:
        return []
    parameters = r.parameters.read(Parameters)
    storage = asdict(results.machine.storage) if results.machine is not None else {}
    layout = Layout.FILES if parameters.existing else Layout.SMALL_FILES
    checks = (
        _small_files_existing(r, parameters) if parameters.existing else _small_files_generated(r),
        _cold_gap(r),
        _readers(r, sorted(parameters.threads), layout),
        _network(r, storage, parameters),
        _rotational(r, storage, parameters),
    )
    return [f for f in checks if f is not None]


def _small_files_generated(m: StageResult) -> Finding | None:
    # The same cache state for both layouts: cold where both are, else warm (one
    # layout's cold figures can be withheld while the other's are not).
    for temp in Cache:
        small_v = _value(m, Layout.SMALL_FILES, Pattern.RANDOM, temp)
        seq_v = _value(m, Layout.SHARD, Pattern.SEQUENTIAL, temp)
        if small_v and seq_v:
            break
    else:
        return None
    seq = (temp, seq_v)
    rand_v = _value(m, Layout.SHARD, Pattern.RANDOM, temp)
    rand = (temp, rand_v) if rand_v else None
    ratio = seq[1] / small_v
    rand_text = ""
    if rand is not None and rand[0] == temp:
        rand_text = (
            f"; the shard read at shuffled offsets {rand[1]:,.0f} MB/s ({rand[1] / small_v:.1f}x)"
        )
    warm_note = "" if temp is Cache.COLD else " (warm cache: cold storage widens the gap)"
    evidence = (
        f"{temp}, 1 reader: one file per sample in shuffled order {small_v:,.0f} MB/s; "
        f"the same samples as one shard read sequentially {seq[1]:,.0f} MB/s "
        f"({ratio:.1f}x){rand_text}{warm_note}"
    )
    if ratio < SMALL_FILES_WARNING:
        return Finding(
            catalogue.IO_SMALL_FILES,
            Severity.OK,
            f"Small files cost little on this storage ({ratio:.1f}x)",
            evidence,
            stage="io",
        )
    return Finding(
        catalogue.IO_SMALL_FILES,
        Severity.CRITICAL if ratio >= SMALL_FILES_CRITICAL else Severity.WARNING,
        f"One file per sample reads {ratio:.1f}x slower than a shard",
        evidence,
        SHARDING
        + (
            " Reading one big file at random offsets is not the fix: shuffle shard order "
            "and within a buffer instead."
            if rand is not None and rand[0] == temp and seq[1] / rand[1] >= SMALL_FILES_WARNING
            else ""
        ),
        Gain(
            GainKind.THROUGHPUT,
            round(ratio, 2),
            f"sequential shard vs shuffled small files, {temp}, 1 reader, measured here",
        ),
        stage="io",
    )


def _small_files_existing(m: StageResult, params: Parameters) -> Finding | None:
    median = params.median_file_bytes
    files = _best(m, Layout.FILES, Pattern.RANDOM)
    if median is None or files is None:
        return None
    temp, v = files
    per_s = _value(m, Layout.FILES, Pattern.RANDOM, temp, Quantity.SAMPLES_PER_S)
    p50 = _value(m, Layout.FILES, Pattern.RANDOM, temp, Quantity.P50_MS)
    evidence = (
        f"{params.small_files_seen:,} files of at most 8 MiB, median "
        f"{median / 1024:,.0f} KiB; {temp}, 1 reader: {v:,.1f} MB/s"
        + (f", {per_s:,.0f} files/s" if per_s else "")
        + (f", {p50:.2f} ms p50 per file" if p50 else "")
    )
    if median >= 1 << 20:
        return Finding(
            catalogue.IO_SMALL_FILES,
            Severity.OK,
            "Files are large enough that per-file cost is small",
            evidence,
            stage="io",
        )
    return Finding(
        catalogue.IO_SMALL_FILES,
        Severity.WARNING,
        f"Dataset is one small file per sample (median {median / 1024:,.0f} KiB)",
        evidence,
        SHARDING,
        Gain(
            GainKind.THROUGHPUT,
            None,
            "run `starvecheck io` (without --existing) on this mount to measure the sharded layout",
        ),
        stage="io",
    )


def _cold_gap(m: StageResult) -> Finding | None:
    gaps = []
    for layout, pattern in (
        (Layout.SMALL_FILES, Pattern.RANDOM),
        (Layout.SHARD, Pattern.RANDOM),
        (Layout.SHARD, Pattern.SEQUENTIAL),
        (Layout.FILES, Pattern.RANDOM),
        (Layout.RANGES, Pattern.RANDOM),
    ):
        base = f"{layout}.{pattern}"
        cold = _value(m, layout, pattern, Cache.COLD)
        warm = _value(m, layout, pattern, Cache.WARM)
        if cold and warm:
            gaps.append((warm / cold, base, cold, warm))
    if not gaps:
        return None
    ratio, base, cold, warm = max(gaps)
    evidence = f"{base}, 1 reader: cold {cold:,.0f} MB/s, warm {warm:,.0f} MB/s ({ratio:.1f}x)"
    if ratio < COLD_GAP_NOTE:
        return Finding(
            catalogue.IO_COLD_CACHE_GAP,
            Severity.OK,
            f"Cold and warm reads are close ({ratio:.1f}x)",
            evidence,
            stage="io",
        )
    return Finding(
        catalogue.IO_COLD_CACHE_GAP,
        Severity.INFO,
        f"A warm page cache makes this storage look {ratio:.1f}x faster than it is",
        evidence + "; benchmarks run twice on the same files measure the cache, not the disk",
        "Judge loaders on cold data (`starvecheck io --cold`). If the dataset fits in free "
        "memory, warm it before the first epoch (`vmtouch -t DIR`, or `cat` the files to "
        "/dev/null); otherwise every epoch reads at the cold figure.",
        Gain(
            GainKind.THROUGHPUT,
            None,
            f"up to {ratio:.1f}x for epochs that would read cold; depends on dataset size "
            "vs page cache",
        ),
        stage="io",
    )


def _readers(m: StageResult, threads: list[int], layout: Layout) -> Finding | None:
    if len(threads) < 2 or threads[-1] < 2:
        return None
    n = threads[-1]
    for temp in Cache:
        one = _value(m, layout, Pattern.RANDOM, temp)
        many = _value(m, layout, Pattern.RANDOM, temp, threads=n)
        if one and many:
            break
    else:
        return None
    scale = many / one
    p50 = _value(m, layout, Pattern.RANDOM, temp, Quantity.P50_MS)
    evidence = (
        f"{layout}.random, {temp}: 1 reader {one:,.0f} MB/s, {n} readers {many:,.0f} MB/s "
        f"({scale:.1f}x)" + (f"; {p50:.2f} ms p50 per sample" if p50 else "")
    )
    if scale < READERS_NOTE:
        return Finding(
            catalogue.IO_FEW_READERS,
            Severity.OK,
            f"More readers add little ({scale:.1f}x with {n}): latency is not the limit",
            evidence,
            stage="io",
        )
    flat = scale < 0.8 * n
    # Readers wait on storage, not the CPU: the one worker rule may go past the CPUs.
    advice = recommend_workers(Throughput({1: one, n: many}, cpu_work=False), Cpus(None))
    n = advice.workers if advice is not None else n
    return Finding(
        catalogue.IO_FEW_READERS,
        Severity.INFO,
        f"{n} concurrent readers read {scale:.1f}x faster than one",
        evidence + ("" if flat else f"; still rising at {n}: more readers would help further"),
        f"Read with at least {n} concurrent readers: `DataLoader(num_workers={n}, ...)`, "
        "or a thread pool inside each worker for latency-bound storage; a single-process "
        "loader (num_workers=0) gets the 1-reader figure.",
        Gain(GainKind.THROUGHPUT, round(scale, 2), f"{n} readers vs 1, {temp}, measured here"),
        stage="io",
        fix={"num_workers": n},
    )


def _cold_small(m: StageResult, params: Parameters) -> tuple[float, float] | None:
    layout = Layout.FILES if params.existing else Layout.SMALL_FILES
    v = _value(m, layout, Pattern.RANDOM, Cache.COLD)
    p50 = _value(m, layout, Pattern.RANDOM, Cache.COLD, Quantity.P50_MS)
    return (v, p50) if v and p50 else None


def _network(m: StageResult, storage: Mapping[str, Any], params: Parameters) -> Finding | None:
    if storage.get("network") is not True:
        return None
    cold = _cold_small(m, params)
    figures = f"; cold small reads {cold[0]:,.0f} MB/s at {cold[1]:.2f} ms p50" if cold else ""
    fs = storage.get("fstype") or "network filesystem"
    return Finding(
        catalogue.IO_NETWORK_STORAGE,
        Severity.WARNING,
        f"Training data is on {fs}, a network or FUSE filesystem",
        f"{storage.get('path')} is on {storage.get('mount_point')} ({fs}, "
        f"{storage.get('source')}){figures}",
        "Copy the dataset to local NVMe on each node before training (s5cmd, rsync, "
        "or Streaming's `StreamingDataset(remote=..., local='/local_nvme/cache')`), "
        "and measure it with `starvecheck io /local_nvme`.",
        Gain(GainKind.THROUGHPUT, None, "measure the local disk to compare"),
        stage="io",
    )


def _rotational(m: StageResult, storage: Mapping[str, Any], params: Parameters) -> Finding | None:
    if storage.get("rotational") is not True:
        return None
    cold = _cold_small(m, params)
    if cold is None:
        return None
    mbps, p50 = cold
    if p50 < SEEK_MS:
        return Finding(
            catalogue.IO_ROTATIONAL,
            Severity.INFO,
            "Disk reports itself as rotational, but reads like flash",
            f"queue/rotational is 1, yet cold small reads take {p50:.2f} ms at the median "
            f"({mbps:,.0f} MB/s); virtual disks (virtio, many cloud volumes) report 1 by "
            "default",
            "Nothing to change for the disk; trust the measured figures over the flag.",
            Gain(GainKind.THROUGHPUT, None, "no change needed"),
            stage="io",
        )
    return Finding(
        catalogue.IO_ROTATIONAL,
        Severity.WARNING,
        f"Data is on a spinning disk: {p50:.1f} ms per cold random read",
        f"queue/rotational is 1 and cold small reads take {p50:.2f} ms at the median "
        f"({mbps:,.0f} MB/s): each one waits for a seek",
        "Move the data to SSD/NVMe, or shard it (" + SHARDING.split(":")[0].lower() + ") so "
        "the disk streams instead of seeking.",
        Gain(GainKind.THROUGHPUT, None, "shard or move to flash, then measure again"),
        stage="io",
    )
