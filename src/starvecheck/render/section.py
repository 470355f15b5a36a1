"""One table of a stage's metrics, as every render module's `sections` returns it.

Each module that shows a stage's metrics (the stage table, core/stages.py, names them)
exposes `sections(stage, metrics) -> (sections, the metrics left)`; render/sections.py
asks them in turn, each on what the ones before it left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from starvecheck.core.metric import Metric


@dataclass(frozen=True)
class Section:
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]
    notes: list[str] = field(default_factory=list)  # printed under the table, dimmed
    right: range = range(0)  # right-aligned (number) columns
    title: str | None = None  # None: the stage's name
    metrics: tuple[Metric, ...] = ()  # the metrics this table shows


def taken(before: Sequence[Metric], rest: Sequence[Metric]) -> tuple[Metric, ...]:
    """The metrics of `before` that a table took (those not left in `rest`)."""
    left = {id(m) for m in rest}
    return tuple(m for m in before if id(m) not in left)
