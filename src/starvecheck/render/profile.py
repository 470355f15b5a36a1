"""Metrics of a `profile` loop as one row per scenario.

The JSON keeps one flat metric per figure (`phase_ms.forward.mds.w2`, ...), labelled
with its quantity, layout and num_workers (and phase); people read a step across its
phases, so the terminal and Markdown show one row per layout and num_workers:
medians over the profiled steps, ± their standard deviation.
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.steps import Phase, ProfileFigures
from starvecheck.render.section import Section, taken

HEADERS = (
    "layout",
    "workers",
    "wait ms",
    "h2d ms",
    "fwd ms",
    "bwd ms",
    "optim ms",
    "step ms",
    "waiting",
    "samples/s",
)
# The statistic the cells show, said under the table (a trace's breakdown shows means).
NOTE = "medians over the profiled steps, ± their standard deviation"
_PHASES = tuple(Phase)  # the columns' phases, in the loop's order


def _ms(m: Figure | None) -> str:
    if m is None or m.value is None:
        return "-"
    digits = 1 if m.value < 100 else 0
    text = f"{m.value:,.{digits}f}"
    if m.n < 2 or m.stdev is None:
        return text
    # The spread to the value's precision, and no finer than whole ms from 10 ms up:
    # ten columns have to fit a 100-character terminal without cutting a figure.
    spread = 1 if digits and m.stdev < 10 else 0
    return f"{text}±{m.stdev:,.{spread}f}"


def split(metrics: Sequence[Metric]) -> tuple[list[tuple[str, ...]], list[Metric]]:
    """(rows, every other metric) of profile's `metrics`, those the tables before this
    one left (the stage table gives profile's results alone to this module): a row per
    scenario of the loop's figures (core/schema/steps.ProfileFigures)."""
    rows = []
    for sc in ProfileFigures.from_metrics(metrics).scenarios:
        share, rate = sc.data_wait_share, sc.samples_per_s
        rows.append(
            (
                sc.layout.value,
                str(sc.workers),
                *(_ms(sc.phase(p)) for p in _PHASES),
                _ms(sc.step_ms),
                "-" if share is None or share.value is None else f"{share.value:.1%}",
                "-" if rate is None or rate.value is None else f"{rate.value:,.1f}",
            )
        )
    return rows, [m for m in metrics if not ProfileFigures.holds(m)]


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rows, rest = split(metrics)
    if not rows:
        return [], rest
    right = range(1, len(HEADERS))
    return [Section(HEADERS, rows, [NOTE], right, metrics=taken(metrics, rest))], rest
