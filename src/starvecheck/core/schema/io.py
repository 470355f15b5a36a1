"""io's parameters, and its figures as records (`IoFigures`): each read pattern
(`Reads`) by layout, pattern, cache state and readers, and the residency checks.

The stage fills an `IoFigures` once; the JSON is its serialisation: `to_metrics()`
writes the labelled metrics of schema 2 and 3, `from_metrics()` reads them back by
their labels, never raising (what it cannot read is left out)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import Metric
from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import counts, flag, number, whole
from starvecheck.core.schema.common import MB_PER_S, PATTERN_RANDOM, SAMPLES_PER_S
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.samples import (
    Cache,
    Layout,
    Residency,
    count_of,
    enum_of,
    labels_of,
)


class Parameters(Base):
    existing = flag()  # the user's own files (--existing), not generated ones
    threads = counts()  # the reader counts measured
    median_file_bytes = number()
    small_files_seen = whole(absent=0)  # --existing: files of at most 8 MiB among them


# --- io's figures as records ---


class Pattern(StrEnum):
    """The order io reads a layout in: shuffled, as a training loader reads, or
    front to back."""

    RANDOM = PATTERN_RANDOM
    SEQUENTIAL = "sequential"


class Quantity(StrEnum):
    """What one of a read pattern's figures is: MB/s (the row's headline), samples/s,
    and each read's latency percentiles."""

    MB_PER_S = MB_PER_S
    SAMPLES_PER_S = SAMPLES_PER_S
    P50_MS = "p50_ms"
    P90_MS = "p90_ms"
    P99_MS = "p99_ms"


_UNITS = {Quantity.MB_PER_S: "MB/s", Quantity.SAMPLES_PER_S: "samples/s"}


@dataclass(frozen=True)
class Place:
    """Where a figure was measured: a layout read in one order, cache state and
    number of readers."""

    layout: Layout
    pattern: Pattern
    cache: Cache
    threads: int = 1

    @property
    def name(self) -> str:
        base = f"{self.layout.value}.{self.pattern.value}.{self.cache.value}"
        return base + (f".t{self.threads}" if self.threads > 1 else "")


@dataclass(frozen=True)
class Reads:
    """One read pattern measured: its figures by quantity (MB/s first), each None
    where not in the run."""

    place: Place
    mb_per_s: Figure | None = None
    samples_per_s: Figure | None = None
    p50_ms: Figure | None = None
    p90_ms: Figure | None = None
    p99_ms: Figure | None = None

    def figure(self, quantity: Quantity) -> Figure | None:
        found: Figure | None = getattr(self, quantity.value)
        return found

    def metric(self, quantity: Quantity) -> Metric | None:
        """One figure as the JSON writes it; None where not in the run."""
        p, figure = self.place, self.figure(quantity)
        if figure is None:
            return None
        where = {"layout": p.layout.value, "pattern": p.pattern.value, "cache": p.cache.value,
                 "threads": p.threads}  # fmt: skip
        name = p.name if quantity is Quantity.MB_PER_S else f"{p.name}.{quantity.value}"
        labels = {"quantity": quantity.value, **where}
        return figure.metric(name, _UNITS.get(quantity, "ms"), labels)

    def metrics(self) -> Iterator[Metric]:
        return (m for q in Quantity if (m := self.metric(q)) is not None)


@dataclass(frozen=True)
class IoFigures:
    """Every figure of an io run: the residency checks, then each read pattern in the
    order measured."""

    residency: tuple[Residency, ...] = ()
    reads: tuple[Reads, ...] = ()

    def at(self, place: Place) -> Reads | None:
        return next((r for r in self.reads if r.place == place), None)

    def to_metrics(self) -> tuple[Metric, ...]:
        """The labelled metrics the JSON carries, in the order the stage writes them."""
        return (
            *(r.metric() for r in self.residency),
            *(m for r in self.reads for m in r.metrics()),
        )

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> IoFigures:
        """The figures a result holds (any this cannot read left out)."""
        residency: list[Residency] = []
        reads: dict[Place, Reads] = {}
        for m in metrics:
            figure, at = Figure.of(m), cls.place(m)
            if (r := Residency.read(m)) is not None:
                residency.append(r)
            elif figure is not None and at is not None:
                place, quantity = at
                was = reads.get(place, Reads(place))
                # mypy checks a **mapping against every field; these names are Figure fields.
                reads[place] = replace(was, **{quantity.value: figure})  # type: ignore[arg-type]
        return cls(tuple(residency), tuple(reads.values()))

    @staticmethod
    def place(m: Metric) -> tuple[Place, Quantity] | None:
        """Which read pattern's figure a metric is, whatever its name (threads absent:
        one reader, as early reports wrote); None where it is none."""
        labels = labels_of(m)
        layout, pattern = (
            enum_of(Layout, labels.get("layout")),
            enum_of(Pattern, labels.get("pattern")),
        )
        cache, quantity = (
            enum_of(Cache, labels.get("cache")),
            enum_of(Quantity, labels.get("quantity")),
        )
        threads = count_of(labels.get("threads", 1))
        if (
            layout is None
            or pattern is None
            or cache is None
            or quantity is None
            or threads is None
        ):
            return None
        return Place(layout, pattern, cache, threads), quantity
