"""Throughput metrics as one row per measurement, for terminal and Markdown.

A stage reports a throughput as `<what>.<cold|warm>[.t<threads>]` in MB/s with
companions `<same>.samples_per_s` and `<same>.p50_ms`/`.p90_ms`/`.p99_ms` (the JSON
keeps them flat, one metric each). People read them better side by side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from starvecheck.model import Metric

_BASE = re.compile(r"(?P<what>.+)\.(?P<temp>cold|warm)(?:\.t(?P<threads>\d{1,6}))?")
COMPANIONS = ("samples_per_s", "p50_ms", "p90_ms", "p99_ms")
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
        sigma = f"{r.stdev / r.value:.0%}" if r.values and r.value else ""
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


def split(metrics: tuple[Metric, ...]) -> tuple[list[Row], list[Metric]]:
    """(throughput rows, every other metric) in the order the stage gave them."""
    names = {m.name: m for m in metrics}
    rows: list[Row] = []
    used: set[str] = set()
    for m in metrics:
        match = _BASE.fullmatch(m.name)
        if m.unit != "MB/s" or match is None:
            continue
        comps = {k: names[f"{m.name}.{k}"] for k in COMPANIONS if f"{m.name}.{k}" in names}
        used.add(m.name)
        used.update(c.name for c in comps.values())
        rows.append(Row(match["what"], match["temp"], int(match["threads"] or 1), m, comps))
    rest = [m for m in metrics if m.name not in used]
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
