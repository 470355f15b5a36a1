"""`loader` figures as one row per (layout, cache, num_workers), for terminal and Markdown.

The JSON keeps one flat metric per figure (`throughput.shard.cold.w2`,
`mbps.shard.cold.w2`, `first_batch_s.shard.w2`, `batch_wait_ms.shard.cold.w2.p50`,
..., labelled with layout, cache and workers); people compare them down a layout's
worker counts. They are read as their record (core/schema/loader.LoaderFigures).
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loader import FIRST, POINT_PARTS, LoaderFigures, Place, Recommended
from starvecheck.core.schema.loader import Parameters as LoaderParameters
from starvecheck.render.section import Section, taken

HEADERS = (
    "layout",
    "cache",
    "workers",
    "samples/s",
    "σ/med",
    "MB/s",
    "1st batch s",
    "wait p50 ms",
    "wait p99 ms",
    "",
)
# Marks the recommended row of each layout; `notes` explains it once.
MARK = "*"


def split(
    stage: StageResult, metrics: Sequence[Metric]
) -> tuple[list[tuple[str, ...]], list[Metric], list[str]]:
    """(rows, every other metric, why some rows are n/a) of `metrics`, those of
    `stage` the tables before this one left (the stage table gives loader's results
    alone to this module). A row is a DataLoader's samples/s at one (layout, cache,
    workers), with the figures measured at the same point (its record's `Point`)."""
    parameters = stage.parameters.read(LoaderParameters)
    first_cache = parameters.first_batch_cache
    figures = LoaderFigures.from_metrics(metrics)  # those left: `stage.records` is all
    judged = figures.curves()
    recommended = Recommended.from_metrics(metrics).layouts
    rows: list[tuple[str, ...]] = []
    used: set[Place] = set()
    reasons: dict[str, list[str]] = {}
    marks = 0
    for point in figures.points:
        if point.rate is None:
            continue
        layout, temp, w = point.layout, point.cache, point.workers
        used.update(Place(part, layout, temp, w) for part in POINT_PARTS)
        first = figures.first_batch(layout, w)
        if first is not None and first_cache.get(layout.value, temp.value) == temp.value:
            used.add(Place(FIRST, layout, None, w))
        else:
            first = None
        if point.rate.value is None:
            where = reasons.setdefault(point.rate.reason or "not measured", [])
            if f"{layout} {temp}" not in where:
                where.append(f"{layout} {temp}")
            rows.append((layout.value, temp.value, str(w), "n/a", *("",) * 6))
            continue
        rec = recommended.get(layout)
        marked = rec == w and judged.get(layout, ("",))[0] == temp
        marks += marked
        value, stdev = point.rate.value, point.rate.stdev
        rows.append(
            (
                layout.value,
                temp.value,
                str(w),
                f"{value:,.0f}",
                f"{(stdev or 0.0) / value:.0%}" if point.rate.n > 1 and value else "",
                _number(point.mbps, ",.0f"),
                _number(first, ".2f"),
                _number(point.wait_p50, ".3f"),
                _number(point.wait_p99, ".3f"),
                MARK if marked else "",
            )
        )
    rest = [m for m in metrics if LoaderFigures.place(m) not in used]
    notes = [f"n/a ({', '.join(w)}): {reason}" for reason, w in reasons.items()]
    if marks:
        cpus = parameters.effective_cpus
        notes.append(
            f"{MARK} recommended num_workers: the fewest within 5% of the layout's best "
            f"samples/s at or below {cpus} effective CPUs (median of each point's epochs; "
            "spread and min … max in the JSON)"
        )
    return rows, rest, notes


def _number(m: Figure | None, fmt: str) -> str:
    if m is None:
        return ""
    return "n/a" if m.value is None else format(m.value, fmt)


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rows, rest, notes = split(stage, metrics)
    if not rows:
        return [], rest
    right = range(2, len(HEADERS) - 1)
    return [Section(HEADERS, rows, notes, right, metrics=taken(metrics, rest))], rest
