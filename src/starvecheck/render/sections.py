"""A stage's metrics as the tables people read, in one order for every renderer.

Each stage keeps flat metrics in the JSON (`shard.random.cold.t2`, `wait_ms.w2`,
`h2d.pinned.256MiB`, ...); the per-stage modules beside this one pivot them into
tables. This module asks each in turn, on the metrics the ones before it left, so
the terminal and the Markdown export show the same tables in the same order, and
whatever no table took is listed as plain metrics after them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starvecheck.model import Metric, StageResult
from starvecheck.render import loader, pad, pcie, profile, sweep, throughput, trace


@dataclass(frozen=True)
class Section:
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]
    notes: list[str] = field(default_factory=list)  # printed under the table, dimmed
    right: range = range(0)  # right-aligned (number) columns
    title: str | None = None  # None: the stage's name


def stage_sections(stage: StageResult) -> tuple[list[Section], list[Metric]]:
    """(the stage's tables, the metrics none of them took). A section without rows
    holds notes alone."""
    out: list[Section] = []
    rates, rest = throughput.split(stage.metrics)
    if rates:
        rows = [r.cells() for r in rates]
        out.append(
            Section(throughput.HEADERS, rows, throughput.missing_reasons(rates), range(3, 10))
        )
    rows, rest, notes = loader.split(rest, stage.parameters)
    if rows:
        out.append(Section(loader.HEADERS, rows, notes, range(2, len(loader.HEADERS) - 1)))
    rows, rest, notes = pad.split(rest, stage.parameters)
    if rows:
        out.append(Section(pad.HEADERS, rows, notes, range(1, len(pad.HEADERS))))
    rows, rest = profile.split(rest)
    if rows:
        out.append(Section(profile.HEADERS, rows, [], range(1, len(profile.HEADERS))))
    rows, rest, notes = trace.split(rest)
    if rows:
        out.append(Section(trace.HEADERS, rows, notes, range(1, len(trace.HEADERS))))
    tables, rest, notes = pcie.split(rest, stage.parameters)
    for t in tables:
        right = range(t.numbers_from, len(t.headers))
        out.append(Section(t.headers, t.rows, t.notes, right, t.title))
    if notes:
        out.append(Section((), [], notes))
    headers, rows, rest = sweep.split(tuple(rest))
    if rows:
        out.append(Section(headers, rows, [], range(1, len(headers))))
    return out, list(rest)
