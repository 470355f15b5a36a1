"""One measured figure inside a stage's records (core/schema/<stage>.py): its value (the
median where repeated), the runs and their statistics, or no value and why. What a
`Metric` holds but its name, unit and labels: those are the record's to write, from
the fields the figure sits in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from starvecheck.core.metric import LabelValue, Metric


def value_of(figure: Figure | None) -> float | None:
    """A figure's value; None where it is missing or not in the run."""
    return None if figure is None else figure.value


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass(frozen=True)
class Figure:
    value: float | None
    values: tuple[float, ...] = ()
    median: float | None = None
    min: float | None = None
    max: float | None = None
    stdev: float | None = None
    reason: str | None = None  # why `value` is None

    @property
    def n(self) -> int:
        return len(self.values)

    @classmethod
    def single(cls, value: float) -> Figure:
        return cls(value)

    @classmethod
    def repeated(cls, values: Iterable[float]) -> Figure:
        """Repeated runs summarised as Metric.repeated does (no runs: missing)."""
        figure = cls.of(Metric.repeated("", values, ""))
        assert figure is not None
        return figure

    @classmethod
    def missing(cls, reason: str) -> Figure:
        return cls(None, reason=reason)

    @classmethod
    def maybe(cls, value: float | None, why: str) -> Figure:
        """The value, or missing with `why` where there is none."""
        return cls.missing(why) if value is None else cls.single(value)

    @classmethod
    def of(cls, m: Metric) -> Figure | None:
        """The figure a metric holds; None where a stored report holds something else
        than numbers (edited by hand): that figure is left out, never raised on."""
        stats = (m.median, m.min, m.max, m.stdev)
        if (
            not (m.value is None or _number(m.value))
            or not isinstance(m.values, tuple)
            or not all(_number(v) for v in m.values)
            or not all(s is None or _number(s) for s in stats)
            or not (m.reason is None or isinstance(m.reason, str))
        ):
            return None
        return cls(m.value, m.values, *stats, reason=m.reason)

    def metric(self, name: str, unit: str, labels: Mapping[str, LabelValue]) -> Metric:
        return Metric(
            name,
            self.value,
            unit,
            self.values,
            self.median,
            self.min,
            self.max,
            self.stdev,
            self.reason,
            dict(labels),
        )
