"""Metrics of a sweep over worker counts as one row per count.

The JSON keeps one flat metric per figure (`wait_ms.w2`, `idle_share.w2`, ...);
people compare them across worker counts, so the terminal and Markdown show a pivot
of the metrics whose only dimension is `workers` (labels `quantity` and `workers`).
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.render.section import Section, taken

SWEEP_LABELS = {"quantity", "workers"}
MAX_COLUMNS = 7  # wider than this, a pivot is harder to read than the list
# Short column labels for names people know from the README; others print as named.
LABELS = {
    "wait_ms": "wait ms (mean)",
    "predicted_wait_ms": "CPU model ms",
    "sleep_model_wait_ms": "sleep model ms",
    "compute_ms": "step ms",
    "idle_share": "GPU idle",
    "first_batch_s": "1st batch s",
}


def _cell(m: Metric | None) -> str:
    if m is None:
        return "-"
    if m.value is None:
        return "n/a"
    if m.unit == "fraction":
        return f"{m.value:.1%}"
    text = f"{m.value:,.1f}" if abs(m.value) < 1000 else f"{m.value:,.0f}"
    if m.values and m.n > 1:
        text += f" ±{m.stdev:,.1f}"
    return text


def split(
    metrics: tuple[Metric, ...],
) -> tuple[tuple[str, ...], list[tuple[str, ...]], list[Metric]]:
    """(headers, rows, other metrics); no rows when the metrics are not a sweep."""
    cells: dict[int, dict[str, Metric]] = {}
    columns: list[str] = []
    rest: list[Metric] = []
    for m in metrics:
        if set(m.labels) != SWEEP_LABELS:
            rest.append(m)
            continue
        what = str(m.labels["quantity"])
        if what not in columns:
            columns.append(what)
        cells.setdefault(int(m.labels["workers"]), {})[what] = m
    if not cells or len(columns) > MAX_COLUMNS:
        return (), [], list(metrics)
    units = {}
    for row in cells.values():
        for what, m in row.items():
            units.setdefault(what, m.unit)
    headers = ("workers", *(LABELS.get(w) or f"{w} ({units[w]})" for w in columns))
    rows = [(str(n), *(_cell(cells[n].get(w)) for w in columns)) for n in sorted(cells)]
    return headers, rows, rest


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    headers, rows, rest = split(tuple(metrics))
    if not rows:
        return [], rest
    right = range(1, len(headers))
    return [Section(headers, rows, [], right, metrics=taken(metrics, rest))], rest
