"""The words of samples on disk, which io, loader and profile read: the layouts the
samples are stored in, the cache state a figure was read in, and the residency check
a cold figure rests on (`Residency`, stages/samples/residency.py's figure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import LabelValue, Metric
from starvecheck.core.schema.figure import Figure

RESIDENT_BEFORE = "resident_before"
E = TypeVar("E", bound=StrEnum)


class Layout(StrEnum):
    """How the samples are stored: one file each, one shard read by offset, MDS
    shards through StreamingDataset; or the user's own (--existing): their small
    files, and byte ranges of their large ones (io)."""

    SMALL_FILES = "small_files"
    SHARD = "shard"
    MDS = "mds"
    FILES = "files"
    RANGES = "ranges"


class Cache(StrEnum):
    """The page cache a figure was read through: emptied first, or holding the data."""

    COLD = "cold"
    WARM = "warm"


def enum_of(kind: type[E], value: LabelValue | None) -> E | None:
    """The label's value as the enum; None where it is none of its values."""
    try:
        return kind(value) if isinstance(value, str) else None
    except ValueError:
        return None


def count_of(value: LabelValue | None) -> int | None:
    """A count label's value (workers, threads); None where it is no whole number."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def labels_of(m: Metric) -> Mapping[str, LabelValue]:
    return m.labels if isinstance(m.labels, Mapping) else {}


@dataclass(frozen=True)
class Residency:
    """The share of a layout's data found in the page cache before each cold run:
    every value kept, the largest (the one that decides) as its value."""

    layout: Layout
    figure: Figure

    @classmethod
    def of(cls, layout: Layout, fractions: list[float]) -> Residency:
        figure = Figure.repeated(round(f, 6) for f in fractions)
        return cls(layout, replace(figure, value=figure.max))

    def metric(self) -> Metric:
        labels = {"quantity": RESIDENT_BEFORE, "layout": self.layout.value}
        return self.figure.metric(f"{RESIDENT_BEFORE}.{self.layout.value}", "fraction", labels)

    @classmethod
    def read(cls, m: Metric) -> Residency | None:
        """The residency a metric holds; None where it holds none."""
        labels = labels_of(m)
        layout = enum_of(Layout, labels.get("layout"))
        figure = Figure.of(m)
        if labels.get("quantity") != RESIDENT_BEFORE or layout is None or figure is None:
            return None
        return cls(layout, figure)
