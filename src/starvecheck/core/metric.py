"""Figures and their caveats: what every stage measures, labelled by the dimensions
it was measured under, and why a figure should be read with care.

A `Metric` is frozen once made: repeated measurements keep their raw values, and the
statistics (median, min, max, stdev) are computed from them when it is built. Code
selects figures by their labels (`select`, `one`, `value`), never by taking a name
apart. Its place in the report: `StageResult` (core/model.py), `Report` (core/report.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from starvecheck.core.jsonvalue import JsonDict, JsonObject

# A label's value: a layout name, a worker count, a size in bytes, ...
LabelValue = str | int | float | bool
Labels = Mapping[str, LabelValue]


@dataclass(frozen=True)
class Metric:
    """A named figure. Repeated measurements keep their raw values and statistics.

    `labels` are the dimensions the figure was measured under; code selects metrics
    by them (`select`, `one`, `value` below), never by taking `name` apart. The
    `quantity` label says what the figure is (`samples_per_s`, `wait_ms`, `gbps`,
    ...), the others under which conditions (`layout`, `cache`, `workers`, ...).
    The flat name is for people and for scripts written against schema 1."""

    name: str
    value: float | None
    unit: str
    values: tuple[float, ...] = ()
    median: float | None = None
    min: float | None = None
    max: float | None = None
    stdev: float | None = None
    reason: str | None = None  # why `value` is None
    labels: Labels = field(default_factory=dict, hash=False)

    @classmethod
    def single(cls, name: str, value: float, unit: str, labels: Labels | None = None) -> Metric:
        return cls(name, value, unit, labels=dict(labels or {}))

    @classmethod
    def repeated(
        cls, name: str, values: Iterable[float], unit: str, labels: Labels | None = None
    ) -> Metric:
        """Summarise repeated runs; the headline value is the median."""
        vals = tuple(float(v) for v in values)
        if not vals:
            return cls.missing(name, unit, "no runs completed", labels)
        median = statistics.median(vals)
        stdev = statistics.stdev(vals) if len(vals) > 1 else 0.0
        return cls(
            name, median, unit, vals, median, min(vals), max(vals), stdev, labels=dict(labels or {})
        )

    @classmethod
    def missing(cls, name: str, unit: str, reason: str, labels: Labels | None = None) -> Metric:
        return cls(name, None, unit, reason=reason, labels=dict(labels or {}))

    def labelled(self, **labels: LabelValue) -> Metric:
        """The same figure with these labels added (or replaced)."""
        return replace(self, labels={**self.labels, **labels})

    def matches(self, **want: LabelValue) -> bool:
        """True when every label asked for has that value (`None` asks for absence)."""
        return all(self.labels.get(k) == v for k, v in want.items())

    @property
    def n(self) -> int:
        return len(self.values)

    def to_dict(self) -> JsonDict:
        d: JsonDict = {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "labels": dict(self.labels),
        }
        if self.values:
            d.update(
                n=self.n,
                median=self.median,
                min=self.min,
                max=self.max,
                stdev=self.stdev,
                values=list(self.values),
            )
        if self.reason is not None:
            d["reason"] = self.reason
        return d

    @classmethod
    def from_dict(cls, d: JsonObject) -> Metric:
        return cls(
            name=cast(str, d["name"]),
            value=cast(float | None, d.get("value")),
            unit=cast(str, d.get("unit", "")),
            values=tuple(cast(list[float], d.get("values", []))),
            median=cast(float | None, d.get("median")),
            min=cast(float | None, d.get("min")),
            max=cast(float | None, d.get("max")),
            stdev=cast(float | None, d.get("stdev")),
            reason=cast(str | None, d.get("reason")),
            labels=dict(cast(Labels, d.get("labels") or {})),
        )


def select(metrics: Iterable[Metric], **want: LabelValue) -> list[Metric]:
    """Every metric whose labels hold these values, in order."""
    return [m for m in metrics if m.matches(**want)]


def one(metrics: Iterable[Metric], **want: LabelValue) -> Metric | None:
    """The first metric whose labels hold these values, or None."""
    return next((m for m in metrics if m.matches(**want)), None)


def value(metrics: Iterable[Metric], **want: LabelValue) -> float | None:
    """The value of `one(...)`, None when there is no such metric or no value."""
    m = one(metrics, **want)
    return None if m is None else m.value


class Caveat(str):
    """Why a figure should be read with care: the sentence people read, carrying a
    stable id (`timing.unstable`, `cache.not-cold`, ...) that code tests for. Built by
    `timing` for the kinds several stages share. A caveat is its text wherever text is
    wanted (printing, JSON, `in`); the JSON keeps the sentence."""

    id: str

    def __new__(cls, id: str, text: str) -> Caveat:
        self = super().__new__(cls, text)
        self.id = id
        return self

    @property
    def text(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Caveat({self.id!r}, {self.text!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Caveat, (self.id, self.text))


def caveat(c: Caveat | str) -> Caveat:
    """A caveat from a plain sentence (a stage's own, one of a kind)."""
    return c if isinstance(c, Caveat) else Caveat("note", str(c))
