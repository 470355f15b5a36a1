"""Metrics of a `pad` run (labelled with a strategy) as one row per strategy.

The JSON keeps one flat metric per figure; people compare strategies, so the
terminal and Markdown show a table, with each strategy's work per step against the
strategy trained with today (--current).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starvecheck.core.metric import Metric, value
from starvecheck.core.model import StageResult
from starvecheck.core.schema.pad import IDEAL, Parameters
from starvecheck.core.strategies import STRATEGIES
from starvecheck.render.section import Section, taken

HEADERS = (
    "strategy",
    "real",
    "padding",
    "pos/batch",
    "max pos",
    "batches",
    "attention",
    "no mask",
    "gain",
)
_FIGURES = (
    "efficiency",
    "padding_positions",
    "positions_per_batch",
    "max_positions_per_batch",
    "batches",
    "attention_vs_ideal",
    "attention_unmasked_vs_ideal",
    "attention_cost",
)
NOTE = (
    "real: share of computed positions that are tokens; padding: padded positions per "
    "epoch; attention: work against per-sample attention (1x); no mask: if samples "
    "sharing a sequence attend to each other; gain: real tokens per step against "
    "--current"
)
# The figures of the lengths themselves: the line under the table.
_SUMMARY = frozenset(
    {"samples", "tokens", "length", "truncated_samples", "truncated_tokens", "empty_samples"}
)


def _is_summary(m: Metric) -> bool:
    quantity = m.labels.get("quantity")
    if quantity == "attention_cost":
        return m.labels.get("strategy") == IDEAL
    return quantity in _SUMMARY


def _count(m: Metric | None) -> str:
    return "-" if m is None or m.value is None else f"{m.value:,.0f}"


def _times(m: Metric | None) -> str:
    return "-" if m is None or m.value is None else f"{m.value:,.2f}x"


def _share(m: Metric | None) -> str:
    if m is None or m.value is None:
        return "-"
    if m.n > 1 and m.min is not None and m.max is not None and m.max - m.min >= 0.0005:
        return f"{m.value:.1%}".replace("%", f"±{(m.max - m.min) / 2 * 100:.1f}%")
    return f"{m.value:.1%}"


def summary(m: list[Metric], context: Any) -> str:
    """The lengths in one line: what every strategy above was fed."""

    def v(quantity: str, statistic: str | None = None) -> float:
        want = {"quantity": quantity, **({"statistic": statistic} if statistic else {})}
        x = value(m, **want)
        return float(x) if x is not None else 0.0

    text = (
        f"{v('samples'):,.0f} samples, {v('tokens'):,.0f} tokens; length median "
        f"{v('length', 'median'):,.0f}, mean {v('length', 'mean'):,.1f}, "
        f"p90 {v('length', 'p90'):,.0f}, p99 {v('length', 'p99'):,.0f}, "
        f"range {v('length', 'min'):,.0f}-{v('length', 'max'):,.0f}"
    )
    cut = v("truncated_samples")
    text += (
        f"; {cut:,.0f} longer than the context ({context}), cut to it"
        if cut
        else f"; none longer than the context ({context})"
    )
    if v("empty_samples"):
        text += f"; {v('empty_samples'):,.0f} empty, left out"
    return text


def split(
    metrics: tuple[Metric, ...] | list[Metric], params: Parameters
) -> tuple[list[tuple[str, ...]], list[Metric], list[str]]:
    """(rows, other metrics, notes); no rows unless the metrics are a pad run's."""
    params = Parameters.of(params)
    cells: dict[str, dict[str, Metric]] = {}
    rest: list[Metric] = []
    lengths: list[Metric] = []
    for m in metrics:
        what, strategy = m.labels.get("quantity"), m.labels.get("strategy")
        if strategy in STRATEGIES and what in _FIGURES:
            cells.setdefault(str(strategy), {})[str(what)] = m
        elif _is_summary(m):
            lengths.append(m)
        else:
            rest.append(m)
    if not cells:
        return [], list(metrics), []
    current = params.current
    base = cells.get(str(current), {}).get("efficiency")
    rows = []
    for s in STRATEGIES:
        if s not in cells:
            continue
        c = cells[s]
        eff = c.get("efficiency")
        relative = (
            f"{eff.value / base.value:,.2f}x"
            if eff is not None and eff.value and base is not None and base.value
            else "-"
        )
        name = f"{s} (current)" if s == current else s
        rows.append(
            (
                name,
                _share(eff),
                _count(c.get("padding_positions")),
                _count(c.get("positions_per_batch")),
                _count(c.get("max_positions_per_batch")),
                _count(c.get("batches")),
                _times(c.get("attention_vs_ideal")),
                _times(c.get("attention_unmasked_vs_ideal")),
                relative,
            )
        )
    notes = [summary(lengths, f"{params.context:,}")] if lengths else []
    return rows, rest, [*notes, NOTE]


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rows, rest, notes = split(metrics, stage.parameters.read(Parameters))
    if not rows:
        return [], rest
    right = range(1, len(HEADERS))
    return [Section(HEADERS, rows, notes, right, metrics=taken(metrics, rest))], rest
