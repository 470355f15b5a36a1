"""Metrics of a sweep over worker counts as one row per count.

The JSON keeps one flat metric per figure (`wait_ms.w2`, `idle_share.w2`, ...);
people compare them across worker counts, so the terminal and Markdown show a pivot
of the sweep's figures, read as starve's records read them
(core/schema/starve.sweep_cell: a count and a quantity, nothing else).
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.starve import Quantity, sweep_cell
from starvecheck.render.section import Section, taken

MAX_COLUMNS = 7  # wider than this, a pivot is harder to read than the list
# Short column labels for names people know from the README; others print as named.
LABELS = {
    Quantity.WAIT_MS: "wait ms (mean)",
    Quantity.PREDICTED_WAIT_MS: "CPU model ms",
    Quantity.SLEEP_MODEL_WAIT_MS: "sleep model ms",
    Quantity.COMPUTE_MS: "step ms",
    Quantity.IDLE_SHARE: "GPU idle",
    Quantity.FIRST_BATCH_S: "1st batch s",
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
    cells: dict[int, dict[Quantity, Metric]] = {}
    columns: list[Quantity] = []
    rest: list[Metric] = []
    for m in metrics:
        cell = sweep_cell(m)
        if cell is None:
            rest.append(m)
            continue
        workers, what = cell
        if what not in columns:
            columns.append(what)
        cells.setdefault(workers, {})[what] = m
    if not cells or len(columns) > MAX_COLUMNS:
        return (), [], list(metrics)
    units: dict[str, str] = {}
    for row in cells.values():
        for what, m in row.items():
            units.setdefault(what, m.unit)
    headers = ("workers", *(LABELS.get(w) or f"{w.value} ({units[w]})" for w in columns))
    rows = [(str(n), *(_cell(cells[n].get(w)) for w in columns)) for n in sorted(cells)]
    return headers, rows, rest


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    headers, rows, rest = split(tuple(metrics))
    if not rows:
        return [], rest
    right = range(1, len(headers))
    return [Section(headers, rows, [], right, metrics=taken(metrics, rest))], rest
