"""Judging a `loader` sweep: how many workers, what workers past the CPUs do, what
worker start-up costs, and what one file per sample costs through a DataLoader.

Reads the sweep as its record (core/schema/loader.LoaderFigures), read from the
metrics by their labels, so a stored report is judged as a fresh one. Every comparison is between
figures of one layout in one cache state, from one run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starvecheck.advice.workers import Cpus, Throughput, recommend_workers
from starvecheck.core import catalogue
from starvecheck.core.figures import headline
from starvecheck.core.metric import Caveat
from starvecheck.core.model import Finding, Gain, GainKind, Judged, Severity, StageResult
from starvecheck.core.schema.loader import Curve, LoaderFigures, Parameters, Recommended
from starvecheck.core.schema.samples import Cache, Layout

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

# num_workers=N over 0: above this, workers are worth a warning.
WORKERS_WARNING = 1.5
# More workers than CPUs count as helping only above this gain.
AS_GOOD = 1.05
SLOW_FIRST_BATCH_S = 1.0
# The shard layouts over one file per sample, each at its own recommended workers.
SMALL_FILES_WARNING = 1.5
SMALL_FILES_CRITICAL = 4.0
# A plain indexed shard over MDS shards: above this, StreamingDataset's own cost shows.
MDS_OVERHEAD_NOTE = 1.5

LABEL = {
    Layout.SMALL_FILES: "one file per sample",
    Layout.SHARD: "one shard (map-style, pread)",
    Layout.MDS: "MDS shards (StreamingDataset)",
    Layout.FILES: "your files",
}


# How to store the data as the layout that measured fastest: the recommendation names
# that layout, never one the same run measured slower.
SHARD_RECIPE = {
    Layout.SHARD: "Pack the samples into large files once and read them by offset: one file of "
    "concatenated samples plus an index of (offset, length), and a map-style Dataset whose "
    "`__getitem__` does `os.pread(fd, length, offset)` (what starvecheck measured as one "
    "shard); WebDataset tar shards are the streaming form of the same idea.",
    Layout.MDS: "Write the dataset as shards once and stream them: "
    "`with MDSWriter(out=DIR, columns={'image': 'jpeg', 'label': 'int'}) as w: "
    "w.write(sample)`, then `StreamingDataset(local=DIR, shuffle=True, "
    "batch_size=...)` in the DataLoader (MosaicML Streaming; WebDataset tar shards work "
    "the same way).",
}


def dataloader_line(parameters: Mapping[str, Any], workers: int) -> str:
    """The DataLoader line for `workers`, at the batch size and prefetch the loader
    stage measured with."""
    params = Parameters.of(parameters)
    batch = params.batch_size or 32
    if workers == 0:
        return f"`DataLoader(dataset, batch_size={batch}, num_workers=0, pin_memory=True)`"
    return (
        f"`DataLoader(dataset, batch_size={batch}, num_workers={workers}, pin_memory=True, "
        f"persistent_workers=True, prefetch_factor={params.prefetch_factor or 2})`"
    )


def recommended(loader: StageResult) -> dict[Layout, int]:
    """num_workers for each layout whose curve has a count at or below the effective
    CPUs (advice.workers: the fewest within 5% of the best, run by run: the counts were
    read in rounds)."""
    cpus = Cpus(loader.parameters.cpus)
    out = {}
    figures = loader.records(LoaderFigures)
    for layout, (temp, curve) in figures.curves().items():
        rounds = figures.rounds(layout, temp)
        advice = recommend_workers(Throughput(curve, rounds=rounds), cpus)
        if advice is not None:
            out[layout] = advice.workers
    return out


def complete(loader: StageResult) -> StageResult:
    """The result as the report carries it: its curves, with the recommended num_workers
    of each layout and overall (the headline layout's), the capacity (the headline
    curve at that count), and a caveat for a layout with no count to recommend. Made
    here, when the run is judged; a stored report's are made again from its curves."""
    caveats: list[Caveat] = []
    figures = loader.records(LoaderFigures)
    judged, rec = figures.curves(), recommended(loader)
    cpus = loader.parameters.cpus
    for layout in judged:
        if layout in rec:
            continue
        caveat = Caveat(
            "loader.no-recommendation",
            f"{layout}: no num_workers at or below the {cpus} effective CPUs was measured, "
            "so none is recommended; add them to --workers",
        )
        if caveat not in caveats:
            caveats.append(caveat)
    counts = {layout: rec[layout] for layout in judged if layout in rec}
    top = headline(rec)
    if top is None:
        made = Recommended(counts).to_metrics()
        return replace(loader, judged=Judged(made, None, tuple(caveats)))
    made = Recommended(counts, rec[top]).to_metrics()
    temp, _ = judged[top]
    point = figures.point(top, temp, rec[top])
    at = None if point is None else point.rate_metric()
    assert at is not None
    capacity = replace(at, name=f"capacity ({at.name})")
    return replace(loader, judged=Judged(made, capacity, tuple(caveats)))


def rules(results: Results) -> list[Finding]:
    """loader's findings, from its result's labelled figures; none without one."""
    m = results.get("loader")
    if m is None:
        return []
    params = m.parameters.read(Parameters)
    judged = m.records(LoaderFigures).curves()
    counts = recommended(m)
    top = headline(counts)
    if top is None:
        return []
    cpus = params.cpus
    temp, curve = judged[top]
    rec = counts[top]
    findings = [
        _workers(top, temp, curve, rec, params),
        _above_cpus(top, temp, curve, rec, cpus),
        _first_batch(m, top, rec, params),
        _small_files(judged, counts),
        _mds_overhead(judged, counts),
    ]
    return [f for f in findings if f is not None]


def _curve_text(curve: Mapping[int, float]) -> str:
    return ", ".join(f"{w}: {v:,.0f}" for w, v in curve.items())


def _workers(
    layout: Layout, temp: Cache, curve: Mapping[int, float], rec: int, params: Parameters
) -> Finding | None:
    if len(curve) < 2:  # one worker count measured: nothing to compare it with
        return None
    evidence = (
        f"{LABEL.get(layout, layout)}, {temp} cache, samples/s by num_workers: "
        f"{_curve_text(curve)}; the fewest workers within 5% of the best at or below "
        f"{params.effective_cpus} effective CPUs: {rec}"
    )
    if rec == 0:
        return Finding(
            catalogue.LOADER_WORKERS,
            Severity.OK,
            f"num_workers=0 delivers as much as any worker count ({curve[0]:,.0f} samples/s)",
            evidence,
            stage="loader",
            fix={"num_workers": 0, "layout": layout.value},
        )
    if not curve.get(0):  # 0 not in the sweep: nothing to compare with
        return None
    speedup = curve[rec] / curve[0]
    return Finding(
        catalogue.LOADER_WORKERS,
        Severity.WARNING if speedup >= WORKERS_WARNING else Severity.INFO,
        f"num_workers={rec} loads {speedup:.1f}x faster than num_workers=0",
        evidence,
        f"Use {dataloader_line(params, rec)}.",
        Gain(
            GainKind.THROUGHPUT,
            round(speedup, 2),
            f"num_workers={rec} vs 0, {LABEL.get(layout, layout)}, {temp}, measured here",
        ),
        stage="loader",
        fix={"num_workers": rec, "layout": layout.value},
    )


def _above_cpus(
    layout: Layout, temp: Cache, curve: Mapping[int, float], rec: int, cpus: int
) -> Finding | None:
    over = [w for w in curve if w > cpus]
    if not over:
        return None
    most = max(over)
    best_at = max(v for w, v in curve.items() if w <= cpus)
    best_over = max(curve[w] for w in over)
    evidence = (
        f"{LABEL.get(layout, layout)}, {temp} cache: num_workers={rec}: {curve[rec]:,.0f} "
        f"samples/s; " + "; ".join(f"num_workers={w}: {curve[w]:,.0f}" for w in over)
    )
    if best_over > best_at * AS_GOOD:
        w_best = max(over, key=lambda w: curve[w])
        if layout is Layout.MDS:
            why = " (waiting in the dataset's own code: Streaming's reader polls for samples "
            why += "with short sleeps; or on storage)"
        else:
            why = " (waiting on storage)" if temp is Cache.COLD else ""
        return Finding(
            catalogue.LOADER_WORKERS_ABOVE_CPUS,
            Severity.INFO,
            f"{w_best} workers delivered {best_over / curve[rec]:.1f}x more than {rec} on "
            f"{cpus} CPUs: the workers wait more than they compute",
            evidence + why,
            f"num_workers={w_best} is worth a try where the training process leaves CPU time "
            f"free; {rec} stays the safe choice, since workers past the CPUs take it from the "
            "training loop and each holds its own memory.",
            Gain(GainKind.THROUGHPUT, None, "loader alone; depends on the CPU training needs"),
            stage="loader",
        )
    slower = curve[most] < curve[rec] / AS_GOOD
    return Finding(
        catalogue.LOADER_WORKERS_ABOVE_CPUS,
        Severity.WARNING,
        f"{most} workers are {'slower than' if slower else 'no faster than'} {rec}: this "
        f"machine has {cpus} effective CPUs",
        evidence,
        f"Set num_workers to at most {cpus} (the effective CPUs: affinity and cgroup quota, not "
        "os.cpu_count()); extra workers compete for the CPUs and add memory and start-up time.",
        Gain(
            GainKind.THROUGHPUT,
            round(curve[rec] / curve[most], 2) if slower else None,
            f"num_workers={rec} instead of {most}, measured here"
            if slower
            else "no throughput; saves memory and worker start-up",
        ),
        stage="loader",
        fix={"num_workers": rec, "layout": layout.value},
    )


def _first_batch(m: StageResult, layout: Layout, rec: int, params: Parameters) -> Finding | None:
    figure = m.records(LoaderFigures).first_batch(layout, rec)
    first = None if figure is None else figure.value
    if first is None or rec == 0:
        return None
    evidence = (
        f"{LABEL.get(layout, layout)}: {first:.2f} s from iter(loader) to the first batch with "
        f"num_workers={rec} (starting the workers and filling their first batches)"
    )
    if first < SLOW_FIRST_BATCH_S:
        return Finding(
            catalogue.LOADER_FIRST_BATCH_SLOW,
            Severity.OK,
            f"Workers deliver the first batch in {first:.2f} s",
            evidence,
            stage="loader",
        )
    return Finding(
        catalogue.LOADER_FIRST_BATCH_SLOW,
        Severity.INFO,
        f"The first batch takes {first:.1f} s with {rec} workers",
        evidence + "; without persistent workers this is paid again at every epoch",
        "Keep the workers between epochs: `DataLoader(..., persistent_workers=True)`.",
        Gain(GainKind.STEP_SHARE, None, "per epoch: depends on the steps in an epoch"),
        stage="loader",
    )


def _small_files(
    judged: Mapping[Layout, Curve], recommended: Mapping[Layout, int]
) -> Finding | None:
    if Layout.SMALL_FILES not in recommended:
        return None
    small_temp, small_curve = judged[Layout.SMALL_FILES]
    small = small_curve[recommended[Layout.SMALL_FILES]]
    shards = []
    for name in (Layout.SHARD, Layout.MDS):
        # Compared in one cache state only: a warm shard against cold small files
        # would flatter the shard.
        if name in recommended and judged[name][0] == small_temp:
            shards.append((judged[name][1][recommended[name]], name))
    if not shards or small <= 0:
        return None
    best, name = max(shards)
    ratio = best / small
    evidence = (
        f"{small_temp} cache, each at its recommended num_workers: one file per sample "
        f"{small:,.0f} samples/s (num_workers={recommended[Layout.SMALL_FILES]}); "
        + "; ".join(
            f"{LABEL[n]} {v:,.0f} (num_workers={recommended[n]})" for v, n in sorted(shards)
        )
    )
    if ratio < SMALL_FILES_WARNING:
        return Finding(
            catalogue.LOADER_SMALL_FILES,
            Severity.OK,
            f"One file per sample costs little through the DataLoader here ({ratio:.1f}x)",
            evidence,
            stage="loader",
        )
    return Finding(
        catalogue.LOADER_SMALL_FILES,
        Severity.CRITICAL if ratio >= SMALL_FILES_CRITICAL else Severity.WARNING,
        f"One file per sample loads {ratio:.1f}x slower than {LABEL[name]}",
        evidence + f"; fastest measured: {LABEL[name]}",
        SHARD_RECIPE[name],
        Gain(
            GainKind.THROUGHPUT,
            round(ratio, 2),
            f"{LABEL[name]} vs one file per sample, {small_temp}, measured here",
        ),
        stage="loader",
        fix={"layout": name.value},
    )


def _mds_overhead(
    judged: Mapping[Layout, Curve], recommended: Mapping[Layout, int]
) -> Finding | None:
    """StreamingDataset does more per sample than a read (it opens the shard file for
    every sample, and hands samples between threads that poll with short sleeps); on
    fast local storage that can cost more than the reads it organises."""
    if Layout.MDS not in recommended or Layout.SHARD not in recommended:
        return None
    temp, mds_curve = judged[Layout.MDS]
    if judged[Layout.SHARD][0] != temp:
        return None
    shard = judged[Layout.SHARD][1][recommended[Layout.SHARD]]
    mds = mds_curve[recommended[Layout.MDS]]
    if mds <= 0 or shard / mds < MDS_OVERHEAD_NOTE:
        return None
    best_w = max(mds_curve, key=lambda w: mds_curve[w])
    return Finding(
        catalogue.LOADER_MDS_OVERHEAD,
        Severity.INFO,
        f"StreamingDataset delivers {shard / mds:.1f}x fewer samples/s than a plain shard here",
        f"{temp} cache, each at its recommended num_workers: one shard (map-style, pread) "
        f"{shard:,.0f} samples/s (num_workers={recommended[Layout.SHARD]}); MDS shards "
        f"(StreamingDataset) {mds:,.0f} (num_workers={recommended[Layout.MDS]}); its best: "
        f"{mds_curve[best_w]:,.0f} with num_workers={best_w}",
        "StreamingDataset does more per sample than the read (it opens the shard file for "
        "each sample, and its threads poll for ready samples with short sleeps), so it needs "
        "more workers than the reads alone: size num_workers from its own figures "
        "(recommended_num_workers.mds). Where the data is on local disk, a map-style dataset "
        "over an indexed shard file reads the same bytes with less work.",
        Gain(GainKind.THROUGHPUT, None, "depends on the storage: compare with `starvecheck io`"),
        stage="loader",
    )
