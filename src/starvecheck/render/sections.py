"""A stage's metrics as the tables people read, in one order for every renderer.

Each stage keeps flat metrics in the JSON, labelled with what they are; the per-stage
modules beside this one select them by label and pivot them into tables. This module
asks each in turn, on the metrics the ones before it left, so the terminal and the
Markdown export show the same tables in the same order, every metric in exactly one
of them (`Section.metrics` says which), and whatever no table took is listed as plain
metrics after them.
"""

from __future__ import annotations

from starvecheck.core import stages as stages_table
from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.render.section import Section

__all__ = ["Section", "stage_sections"]


def stage_sections(stage: StageResult) -> tuple[list[Section], list[Metric]]:
    """(the stage's tables, the metrics none of them took). A section without rows
    holds notes alone. The stage's render modules (its row of the stage table) are
    asked in turn, then the ones every stage's metrics may need (a sweep by workers)."""
    out: list[Section] = []
    metrics = list(stage.figures)
    modules = (*stages_table.entry(stage.stage).render, *stages_table.RENDER_LAST)
    for name in modules:
        shown, metrics = stages_table.load(name).sections(stage, metrics)
        out += shown
    return out, list(metrics)
