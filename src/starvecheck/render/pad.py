"""The figures of a `pad` run as one row per strategy.

The JSON keeps one flat metric per figure; people compare strategies, so the
terminal and Markdown show a table, with each strategy's work per step against the
strategy trained with today (--current). The figures are read as their record
(core/schema/pad.PadFigures, `StageResult.records`), by field.
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure, value_of
from starvecheck.core.schema.pad import Lengths, PadFigures, Parameters, Strategy
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
NOTE = (
    "real: share of computed positions that are tokens; padding: padded positions per "
    "epoch; attention: work against per-sample attention (1x); no mask: if samples "
    "sharing a sequence attend to each other; gain: real tokens per step against "
    "--current"
)


def _count(m: Figure | None) -> str:
    return "-" if m is None or m.value is None else f"{m.value:,.0f}"


def _times(m: Figure | None) -> str:
    return "-" if m is None or m.value is None else f"{m.value:,.2f}x"


def _share(m: Figure | None) -> str:
    if m is None or m.value is None:
        return "-"
    if m.n > 1 and m.min is not None and m.max is not None and m.max - m.min >= 0.0005:
        return f"{m.value:.1%}".replace("%", f"±{(m.max - m.min) / 2 * 100:.1f}%")
    return f"{m.value:.1%}"


def _summary(lengths: Lengths, context: str) -> str:
    """The lengths in one line: what every strategy above was fed."""

    def v(figure: Figure | None) -> float:
        x = value_of(figure)
        return float(x) if x is not None else 0.0

    text = (
        f"{v(lengths.samples):,.0f} samples, {v(lengths.tokens):,.0f} tokens; length median "
        f"{v(lengths.median):,.0f}, mean {v(lengths.mean):,.1f}, "
        f"p90 {v(lengths.p90):,.0f}, p99 {v(lengths.p99):,.0f}, "
        f"range {v(lengths.min):,.0f}-{v(lengths.max):,.0f}"
    )
    cut = v(lengths.truncated_samples)
    text += (
        f"; {cut:,.0f} longer than the context ({context}), cut to it"
        if cut
        else f"; none longer than the context ({context})"
    )
    if v(lengths.empty_samples):
        text += f"; {v(lengths.empty_samples):,.0f} empty, left out"
    return text


def _rows(figures: PadFigures, current: str | None) -> list[tuple[str, ...]]:
    """One row per strategy laid out, in the order people read them."""
    base = figures.cost(current) if current is not None else None
    base_eff = base.efficiency if base is not None else None
    rows: list[tuple[str, ...]] = []
    for s in Strategy:
        c = figures.cost(s)
        if c is None:
            continue
        eff = c.efficiency
        relative = (
            f"{eff.value / base_eff.value:,.2f}x"
            if eff is not None and eff.value and base_eff is not None and base_eff.value
            else "-"
        )
        rows.append(
            (
                f"{s} (current)" if s == current else s.value,
                _share(eff),
                _count(c.padding_positions),
                _count(c.positions_per_batch),
                _count(c.max_positions_per_batch),
                _count(c.batches),
                _times(c.attention_vs_ideal),
                _times(c.attention_unmasked_vs_ideal),
                relative,
            )
        )
    return rows


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    """The strategies' table, the lengths fed in a line under it."""
    if not any(PadFigures.is_cost(m) for m in metrics):  # not a pad run's
        return [], list(metrics)
    rest = [m for m in metrics if not PadFigures.holds(m)]
    figures, params = stage.records(PadFigures), stage.parameters.read(Parameters)
    shown = [m for m in metrics if PadFigures.holds(m) and not PadFigures.is_cost(m)]
    notes = [_summary(figures.lengths, f"{params.context:,}")] if shown else []
    rows = _rows(figures, params.current)
    right = range(1, len(HEADERS))
    return [Section(HEADERS, rows, [*notes, NOTE], right, metrics=taken(metrics, rest))], rest
