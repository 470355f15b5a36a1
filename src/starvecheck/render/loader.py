"""`loader` metrics as one row per (layout, cache, num_workers), for terminal and Markdown.

The JSON keeps one flat metric per figure (`throughput.shard.cold.w2`,
`mbps.shard.cold.w2`, `first_batch_s.shard.w2`, `batch_wait_ms.shard.cold.w2.p50`,
...); people compare them down a layout's worker counts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from starvecheck.model import Metric

_RATE = re.compile(r"throughput\.(?P<layout>[a-z_]+)\.(?P<temp>cold|warm)\.w(?P<w>\d{1,4})")
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
    metrics: Sequence[Metric], parameters: Mapping[str, Any]
) -> tuple[list[tuple[str, ...]], list[Metric], list[str]]:
    """(rows, every other metric, why some rows are n/a); no rows for other stages."""
    from starvecheck.stages.loader import curves

    names = {m.name: m for m in metrics}
    first_cache = parameters.get("first_batch_cache") or {}
    judged = curves(metrics)
    rows: list[tuple[str, ...]] = []
    used: set[str] = set()
    reasons: dict[str, list[str]] = {}
    marks = 0
    for m in metrics:
        match = _RATE.fullmatch(m.name)
        if match is None:
            continue
        layout, temp, w = match["layout"], match["temp"], int(match["w"])
        base = f"{layout}.{temp}.w{w}"
        mbps = names.get(f"mbps.{base}")
        p50 = names.get(f"batch_wait_ms.{base}.p50")
        p99 = names.get(f"batch_wait_ms.{base}.p99")
        first = names.get(f"first_batch_s.{layout}.w{w}")
        used.update(x.name for x in (m, mbps, p50, p99) if x is not None)
        if first is not None and first_cache.get(layout, temp) == temp:
            used.add(first.name)
        else:
            first = None
        if m.value is None:
            where = reasons.setdefault(m.reason or "not measured", [])
            if f"{layout} {temp}" not in where:
                where.append(f"{layout} {temp}")
            rows.append((layout, temp, str(w), "n/a", *("",) * 6))
            continue
        rec = names.get(f"recommended_num_workers.{layout}")
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
    rest = [m for m in metrics if m.name not in used]
    notes = [f"n/a ({', '.join(w)}): {reason}" for reason, w in reasons.items()]
    if marks:
        cpus = parameters.get("effective_cpus")
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
