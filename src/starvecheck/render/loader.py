"""`loader` metrics as one row per (layout, cache, num_workers), for terminal and Markdown.

The JSON keeps one flat metric per figure (`throughput.shard.cold.w2`,
`mbps.shard.cold.w2`, `first_batch_s.shard.w2`, `batch_wait_ms.shard.cold.w2.p50`,
..., labelled with layout, cache and workers); people compare them down a layout's
worker counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.figures import loader_curves
from starvecheck.core.metric import Metric, one, select
from starvecheck.core.model import StageResult
from starvecheck.core.schema.common import (
    FIRST_BATCH_S,
    MB_PER_S,
    RECOMMENDED_NUM_WORKERS,
    SAMPLES_PER_S,
)
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
    alone to this module). A row is a
    DataLoader's samples/s at one (layout, cache, workers), with the figures measured
    under the same labels."""
    parameters = stage.parameters.read(LoaderParameters)
    first_cache = parameters.first_batch_cache
    judged = loader_curves(metrics)
    rows: list[tuple[str, ...]] = []
    used: set[int] = set()
    reasons: dict[str, list[str]] = {}
    marks = 0
    for m in select(metrics, quantity=SAMPLES_PER_S):
        if not {"layout", "cache", "workers"} <= set(m.labels):
            continue
        layout, temp, w = str(m.labels["layout"]), str(m.labels["cache"]), int(m.labels["workers"])
        where = {"layout": layout, "cache": temp, "workers": w}
        mbps = one(metrics, quantity=MB_PER_S, **where)
        p50 = one(metrics, quantity="batch_wait_p50_ms", **where)
        p99 = one(metrics, quantity="batch_wait_p99_ms", **where)
        first = one(metrics, quantity=FIRST_BATCH_S, layout=layout, workers=w)
        used.update(id(x) for x in (m, mbps, p50, p99) if x is not None)
        if first is not None and first_cache.get(layout, temp) == temp:
            used.add(id(first))
        else:
            first = None
        if m.value is None:
            where = reasons.setdefault(m.reason or "not measured", [])
            if f"{layout} {temp}" not in where:
                where.append(f"{layout} {temp}")
            rows.append((layout, temp, str(w), "n/a", *("",) * 6))
            continue
        rec = one(metrics, quantity=RECOMMENDED_NUM_WORKERS, layout=layout)
        marked = rec is not None and rec.value == w and judged.get(layout, ("",))[0] == temp
        marks += marked
        rows.append(
            (
                layout,
                temp,
                str(w),
                f"{m.value:,.0f}",
                f"{m.stdev / m.value:.0%}" if m.n > 1 and m.value else "",
                _number(mbps, ",.0f"),
                _number(first, ".2f"),
                _number(p50, ".3f"),
                _number(p99, ".3f"),
                MARK if marked else "",
            )
        )
    rest = [m for m in metrics if id(m) not in used]
    notes = [f"n/a ({', '.join(w)}): {reason}" for reason, w in reasons.items()]
    if marks:
        cpus = parameters.effective_cpus
        notes.append(
            f"{MARK} recommended num_workers: the fewest within 5% of the layout's best "
            f"samples/s at or below {cpus} effective CPUs (median of each point's epochs; "
            "spread and min … max in the JSON)"
        )
    return rows, rest, notes


def _number(m: Metric | None, fmt: str) -> str:
    if m is None:
        return ""
    return "n/a" if m.value is None else format(m.value, fmt)


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rows, rest, notes = split(stage, metrics)
    if not rows:
        return [], rest
    right = range(2, len(HEADERS) - 1)
    return [Section(HEADERS, rows, notes, right, metrics=taken(metrics, rest))], rest
