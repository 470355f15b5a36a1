"""io's throughput metrics as one row per measurement, for terminal and Markdown.

io reports a read pattern's throughput in MB/s (labels: quantity `mb_per_s`,
layout, pattern, cache, threads) with companions under the same labels
(`samples_per_s`, `p50_ms`, `p90_ms`, `p99_ms`; the JSON keeps them flat, one metric
each). People read them better side by side; where each figure sits is its record's
(core/schema/io.IoFigures.place).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.io import IoFigures, Place, Quantity
from starvecheck.render.section import Section, taken

# A row's figures beside its MB/s, as the JSON's `quantity` names them.
COMPANIONS = tuple(q.value for q in Quantity if q is not Quantity.MB_PER_S)
HEADERS = (
    "pattern",
    "cache",
    "readers",
    "MB/s",
    "min … max",
    "σ/med",
    "samples/s",
    "p50 ms",
    "p90 ms",
    "p99 ms",
)


@dataclass(frozen=True)
class Row:
    what: str
    temp: str
    threads: int
    rate: Metric
    companions: dict[str, Metric]

    def cells(self) -> tuple[str, ...]:
        r = self.rate
        if r.value is None:
            # The reason is long and the same for many rows: `missing_reasons` lists it once.
            return (self.what, self.temp, str(self.threads), "n/a", *("",) * 6)

        def comp(key: str, fmt: str) -> str:
            m = self.companions.get(key)
            return format(m.value, fmt) if m is not None and m.value is not None else "-"

        spread = f"{r.min:,.0f} … {r.max:,.0f}" if r.values else ""
        sigma = f"{r.stdev / r.value:.0%}" if r.values and r.value and r.stdev is not None else ""
        return (
            self.what,
            self.temp,
            str(self.threads),
            f"{r.value:,.0f}" if r.value >= 10 else f"{r.value:.2f}",
            spread,
            sigma,
            comp("samples_per_s", ",.0f"),
            comp("p50_ms", ".3f"),
            comp("p90_ms", ".3f"),
            comp("p99_ms", ".3f"),
        )


def split(metrics: Sequence[Metric]) -> tuple[list[Row], list[Metric]]:
    """(throughput rows, every other metric) of io's `metrics`, in the order it gave
    them (the stage table gives io's results alone to this module). A row is a read
    pattern's MB/s with its companions measured at the same place (where its record,
    core/schema/io.IoFigures, puts them)."""
    placed = [(m, at) for m in metrics if (at := IoFigures.place(m)) is not None]
    companions: dict[Place, dict[str, Metric]] = {}
    for m, (place, quantity) in placed:
        if quantity is not Quantity.MB_PER_S:
            companions.setdefault(place, {})[quantity.value] = m
    rows: list[Row] = []
    used: set[int] = set()
    for m, (place, quantity) in placed:
        if quantity is not Quantity.MB_PER_S:
            continue
        comps = companions.get(place, {})
        used.add(id(m))
        used.update(id(c) for c in comps.values())
        what = f"{place.layout.value}.{place.pattern.value}"
        rows.append(Row(what, place.cache.value, place.threads, m, comps))
    rest = [m for m in metrics if id(m) not in used]
    return rows, rest


def missing_reasons(rows: list[Row]) -> list[str]:
    """Why rows show n/a, each reason once, naming the rows it applies to."""
    by_reason: dict[str, list[str]] = {}
    for row in rows:
        if row.rate.value is None:
            labels = by_reason.setdefault(row.rate.reason or "not measured", [])
            if f"{row.what} {row.temp}" not in labels:  # every reader count alike
                labels.append(f"{row.what} {row.temp}")
    return [f"n/a ({', '.join(labels)}): {reason}" for reason, labels in by_reason.items()]


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rates, rest = split(metrics)
    if not rates:
        return [], rest
    rows = [r.cells() for r in rates]
    notes = missing_reasons(rates)
    return [Section(HEADERS, rows, notes, range(3, 10), metrics=taken(metrics, rest))], rest
