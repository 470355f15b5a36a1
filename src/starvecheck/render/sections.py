"""A stage's metrics as the tables people read, in one order for every renderer.

Each stage keeps flat metrics in the JSON, labelled with what they are; the per-stage
modules beside this one select them by label and pivot them into tables. This module
asks each in turn, on the metrics the ones before it left, so the terminal and the
Markdown export show the same tables in the same order, every metric in exactly one
of them (`Section.metrics` says which), and whatever no table took is listed as plain
metrics after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.render import attach as attached
from starvecheck.render import factory as ownloader
from starvecheck.render import loader, pad, pcie, profile, sweep, throughput, trace


@dataclass(frozen=True)
class Section:
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]
    notes: list[str] = field(default_factory=list)  # printed under the table, dimmed
    right: range = range(0)  # right-aligned (number) columns
    title: str | None = None  # None: the stage's name
    metrics: tuple[Metric, ...] = ()  # the metrics this table shows


HEADERS_ATTACH = attached.HEADERS


def _taken(before: Sequence[Metric], rest: Sequence[Metric]) -> tuple[Metric, ...]:
    left = {id(m) for m in rest}
    return tuple(m for m in before if id(m) not in left)


def stage_sections(stage: StageResult) -> tuple[list[Section], list[Metric]]:
    """(the stage's tables, the metrics none of them took). A section without rows
    holds notes alone."""
    out: list[Section] = []
    metrics = list(stage.metrics)
    rates, rest = throughput.split(stage, metrics)
    if rates:
        rows = [r.cells() for r in rates]
        notes = throughput.missing_reasons(rates)
        out.append(
            Section(throughput.HEADERS, rows, notes, range(3, 10), metrics=_taken(metrics, rest))
        )
    before = rest
    rows, rest, notes = loader.split(stage, before)
    if rows:
        right = range(2, len(loader.HEADERS) - 1)
        out.append(Section(loader.HEADERS, rows, notes, right, metrics=_taken(before, rest)))
    before = rest
    rows, costs, rest, notes = ownloader.split(stage, before)
    if rows:
        title = f"your pipeline: {stage.parameters.factory}"
        right = range(0, len(ownloader.HEADERS) - 1)
        out.append(Section(ownloader.HEADERS, rows, [], right, title, _taken(before, rest)))
        right = range(0, len(ownloader.COST_HEADERS))
        out.append(Section(ownloader.COST_HEADERS, costs, notes, right, "what it costs"))
    before = rest
    rows, rest, notes = pad.split(before, stage.parameters)
    if rows:
        right = range(1, len(pad.HEADERS))
        out.append(Section(pad.HEADERS, rows, notes, right, metrics=_taken(before, rest)))
    before = rest
    rows, rest = profile.split(stage, before)
    if rows:
        right = range(1, len(profile.HEADERS))
        notes = [profile.NOTE]
        out.append(Section(profile.HEADERS, rows, notes, right, metrics=_taken(before, rest)))
    before = rest
    rows, rest, notes = trace.split(stage, before)
    if rows:
        right = range(1, len(trace.HEADERS))
        out.append(Section(trace.HEADERS, rows, notes, right, metrics=_taken(before, rest)))
    before = rest
    rows, rest, notes = trace.ranks(stage, before)
    if rows:
        right = range(1, len(trace.RANK_HEADERS))
        out.append(
            Section(trace.RANK_HEADERS, rows, notes, right, "every rank", _taken(before, rest))
        )
    before = rest
    rows, rest, notes = trace.loop_ranks(stage, before)
    if rows:
        right = range(1, len(trace.LOOP_RANK_HEADERS) - 1)
        out.append(
            Section(trace.LOOP_RANK_HEADERS, rows, notes, right, "every rank", _taken(before, rest))
        )
    before = rest
    tables, rest, notes = pcie.split(before, stage.parameters, stage.judged)
    taken = _taken(before, rest)
    for i, t in enumerate(tables):
        right = range(t.numbers_from, len(t.headers))
        # pcie's tables share the figures they were made of: listed under the first.
        out.append(
            Section(t.headers, t.rows, t.notes, right, t.title, metrics=taken if i == 0 else ())
        )
    if notes:
        out.append(Section((), [], notes, metrics=() if tables else taken))
    before = rest
    rows, rest, notes = attached.split(stage, before)
    if rows:
        right = range(3, 4)
        out.append(Section(HEADERS_ATTACH, rows, notes, right, metrics=_taken(before, rest)))
    before = rest
    headers, rows, rest = sweep.split(tuple(before))
    if rows:
        right = range(1, len(headers))
        out.append(Section(headers, rows, [], right, metrics=_taken(before, rest)))
    return out, list(rest)
