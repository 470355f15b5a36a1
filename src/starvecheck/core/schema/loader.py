"""loader's and starve's parameters: a num_workers sweep of generated data (loader)
or of a simulated sample cost (starve); and loader's figures as records
(`LoaderFigures`): its curves by layout, cache state and num_workers.

The stage fills a `LoaderFigures` once; the JSON is its serialisation: `to_metrics()`
writes the labelled metrics of schema 2 and 3 (names, labels, units, order),
`from_metrics()` reads them back by their labels, never raising (what it cannot read
is left out). Judging's recommended counts are a record of their own
(`Recommended`), written among judging's figures."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from starvecheck.core.metric import Labels, Metric
from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import flag, items, mapping, number, whole
from starvecheck.core.schema.common import (
    FIRST_BATCH_S,
    MB_PER_S,
    RECOMMENDED_NUM_WORKERS,
    SAMPLES_PER_S,
)
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
    """loader's."""

    sample_size_bytes = whole(absent=0)
    prefetch_factor = whole()  # batches each worker loads ahead
    first_batch_cache = mapping()  # the cache state each first batch met


class StarveParameters(Base):
    """starve's."""

    sample_ms = number()  # the CPU time per sample it was given (D)
    sample_cpu_ms = number()  # ... as measured
    capacity_workers = whole()  # the worker count its capacity is at
    assumed = items()  # which of its inputs were assumed, not given
    cuda = flag()  # a CUDA device was present


# The quantity of each percentile of the time blocked waiting for a batch.
WAIT_P50, WAIT_P99 = "batch_wait_p50_ms", "batch_wait_p99_ms"
_POINT = {  # a point's figures: (field, quantity, name's prefix, suffix, unit), in order
    "rate": (SAMPLES_PER_S, "throughput", "", "samples/s"),
    "mbps": (MB_PER_S, "mbps", "", "MB/s"),
    "wait_p50": (WAIT_P50, "batch_wait_ms", ".p50", "ms"),
    "wait_p99": (WAIT_P99, "batch_wait_ms", ".p99", "ms"),
}
_FIELD = {quantity: name for name, (quantity, *_) in _POINT.items()}
POINT_PARTS = tuple(_POINT)  # the fields of a Point that hold its figures

Curve = tuple[Cache, dict[int, float]]  # (cache state, samples/s by num_workers)


@dataclass(frozen=True)
class Point:
    """One (layout, cache, num_workers) of the sweep: samples/s and MB/s once started
    (the epochs' medians, every epoch kept), and the time blocked for each later batch
    (p50, p99, ms)."""

    layout: Layout
    cache: Cache
    workers: int
    rate: Figure | None = None
    mbps: Figure | None = None
    wait_p50: Figure | None = None
    wait_p99: Figure | None = None

    def rate_metric(self) -> Metric | None:
        """samples/s as the JSON writes it (judging's capacity is this figure)."""
        return next(self.metrics(), None) if self.rate is not None else None

    def metrics(self) -> Iterator[Metric]:
        base = f"{self.layout.value}.{self.cache.value}.w{self.workers}"
        where = {"layout": self.layout.value, "cache": self.cache.value, "workers": self.workers}
        for name, (quantity, prefix, suffix, unit) in _POINT.items():
            figure: Figure | None = getattr(self, name)
            if figure is not None:
                labels = {"quantity": quantity, **where}
                yield figure.metric(f"{prefix}.{base}{suffix}", unit, labels)


@dataclass(frozen=True)
class FirstBatch:
    """From iter(loader) to the first batch at one num_workers: worker start-up, in
    the cache state parameters' `first_batch_cache` names."""

    layout: Layout
    workers: int
    figure: Figure

    def metric(self) -> Metric:
        layout, w = self.layout.value, self.workers
        labels: Labels = {"quantity": FIRST_BATCH_S, "layout": layout, "workers": w}
        return self.figure.metric(f"{FIRST_BATCH_S}.{layout}.w{w}", "s", labels)


@dataclass(frozen=True)
class Unmeasured:
    """A layout the sweep could not read at all, and why (MDS without Streaming)."""

    layout: Layout
    reason: str

    def metric(self) -> Metric:
        labels = {"quantity": SAMPLES_PER_S, "layout": self.layout.value}
        return Metric.missing(f"throughput.{self.layout.value}", "samples/s", self.reason, labels)


@dataclass(frozen=True)
class LoaderFigures:
    """Every figure of a loader sweep: the residency checks, each point and each
    first batch (grouped by layout, in the order measured), and the layouts not read."""

    residency: tuple[Residency, ...] = ()
    points: tuple[Point, ...] = ()
    first_batches: tuple[FirstBatch, ...] = ()
    unmeasured: tuple[Unmeasured, ...] = ()

    def layouts(self) -> list[Layout]:
        """The layouts with points, in the order measured."""
        return list(dict.fromkeys(p.layout for p in self.points))

    def point(self, layout: Layout, cache: Cache, workers: int) -> Point | None:
        want = (layout, cache, workers)
        return next((p for p in self.points if (p.layout, p.cache, p.workers) == want), None)

    def first_batch(self, layout: Layout, workers: int) -> Figure | None:
        return next(
            (f.figure for f in self.first_batches if (f.layout, f.workers) == (layout, workers)),
            None,
        )

    def curve(self, layout: Layout) -> Curve | None:
        """The cache state a layout is judged in and its samples/s by num_workers: cold
        where every cold point was measured (first epochs, datasets larger than
        memory), else warm. None when neither is complete."""
        for cache in Cache:
            points = [p for p in self.points if (p.layout, p.cache) == (layout, cache)]
            rates = {p.workers: p.rate.value if p.rate else None for p in points}
            if points and all(v is not None for v in rates.values()):
                return cache, {w: v for w, v in sorted(rates.items()) if v is not None}
        return None

    def curves(self) -> dict[Layout, Curve]:
        """Every measured layout's curve, in the order they were measured."""
        return {x: c for x in self.layouts() if (c := self.curve(x)) is not None}

    def rounds(self, layout: Layout, cache: Cache) -> dict[int, tuple[float, ...]]:
        """A layout's samples/s by num_workers in one cache state, each count's figures
        in run order: counts read in rounds pair run by run (stages/loader/epochs.py)."""
        return {
            p.workers: p.rate.values or (p.rate.value,)
            for p in self.points
            if (p.layout, p.cache) == (layout, cache)
            and p.rate is not None
            and p.rate.value is not None
        }

    def to_metrics(self) -> tuple[Metric, ...]:
        """The labelled metrics the JSON carries, in the order the stage writes them."""
        out = [r.metric() for r in self.residency]
        layouts = dict.fromkeys([*self.layouts(), *(f.layout for f in self.first_batches)])
        for layout in layouts:
            out += [m for p in self.points if p.layout is layout for m in p.metrics()]
            out += [f.metric() for f in self.first_batches if f.layout is layout]
        return (*out, *(u.metric() for u in self.unmeasured))

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> LoaderFigures:
        """The figures a result holds (other metrics, and any this cannot read, left
        out)."""
        residency: list[Residency] = []
        points: dict[tuple[Layout, Cache, int], Point] = {}
        first: list[FirstBatch] = []
        unmeasured: list[Unmeasured] = []
        for m in metrics:
            figure, place = Figure.of(m), cls.place(m)
            if (r := Residency.read(m)) is not None:
                residency.append(r)
            elif figure is None or place is None:
                continue
            elif place.part == FIRST and place.workers is not None:
                first.append(FirstBatch(place.layout, place.workers, figure))
            elif place.part == UNMEASURED:
                unmeasured.append(Unmeasured(place.layout, figure.reason or ""))
            elif place.cache is not None and place.workers is not None:
                key = (place.layout, place.cache, place.workers)
                # mypy checks a **mapping against every field; these names are Figure fields.
                was = points.get(key, Point(*key))
                points[key] = replace(was, **{place.part: figure})  # type: ignore[arg-type]
        return cls(tuple(residency), tuple(points.values()), tuple(first), tuple(unmeasured))

    @staticmethod
    def place(m: Metric) -> Place | None:
        """Which figure of a sweep a metric is, whatever its name; None where it is
        none (a residency check, judging's, another stage's)."""
        labels = labels_of(m)
        quantity = labels.get("quantity")
        layout = enum_of(Layout, labels.get("layout"))
        workers = count_of(labels.get("workers"))
        cache = enum_of(Cache, labels.get("cache"))
        if layout is None or "threads" in labels or "pattern" in labels:
            return None
        if quantity == FIRST_BATCH_S and workers is not None and "cache" not in labels:
            return Place(FIRST, layout, None, workers)
        if quantity == SAMPLES_PER_S and "workers" not in labels and "cache" not in labels:
            return Place(UNMEASURED, layout, None, None)
        part = _FIELD.get(str(quantity))
        if part is None or cache is None or workers is None:
            return None
        return Place(part, layout, cache, workers)


FIRST, UNMEASURED = "first_batch", "unmeasured"


@dataclass(frozen=True)
class Place:
    """Where a metric sits in a sweep: a point's figure (`part` one of Point's
    figure fields), a first batch, or a layout not read."""

    part: str
    layout: Layout
    cache: Cache | None
    workers: int | None


@dataclass(frozen=True)
class Recommended:
    """Judging's num_workers for each layout with a count to recommend, and overall
    (the headline layout's): written among judging's figures."""

    layouts: Mapping[Layout, int] = field(default_factory=dict)
    overall: int | None = None

    def to_metrics(self) -> tuple[Metric, ...]:
        made = [
            Metric.single(
                f"{RECOMMENDED_NUM_WORKERS}.{layout.value}",
                k,
                "workers",
                {"quantity": RECOMMENDED_NUM_WORKERS, "layout": layout.value},
            )
            for layout, k in self.layouts.items()
        ]
        if self.overall is not None:
            labels = {"quantity": RECOMMENDED_NUM_WORKERS}
            made.append(Metric.single(RECOMMENDED_NUM_WORKERS, self.overall, "workers", labels))
        return tuple(made)

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> Recommended:
        layouts: dict[Layout, int] = {}
        overall = None
        for m in metrics:
            labels = labels_of(m)
            if labels.get("quantity") != RECOMMENDED_NUM_WORKERS or not _whole(m.value):
                continue
            if "layout" not in labels:
                overall = int(m.value or 0)
            elif (layout := enum_of(Layout, labels.get("layout"))) is not None:
                layouts[layout] = int(m.value or 0)
        return cls(layouts, overall)


def _whole(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and float(x).is_integer()
