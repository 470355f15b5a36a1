"""starve's figures as records (`StarveFigures`): the CPU time of a sample, and at
each num_workers of the sweep what the GPU waited, what the models predicted, the
step, the GPU's idle share and the first batch. Its parameters are
core/schema/loader.StarveParameters (a num_workers sweep, as loader's).

The stage fills a `StarveFigures` once; the JSON is its serialisation: `to_metrics()`
writes the labelled metrics of schema 2 and 3 (names, labels, units, order),
`from_metrics()` reads them back by their labels, never raising (what it cannot read
is left out)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import Labels, Metric
from starvecheck.core.schema.common import FIRST_BATCH_S, SAMPLE_CPU_MS
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.samples import count_of, enum_of, labels_of


class Quantity(StrEnum):
    """A point's figures, in the order the stage writes them: the mean wait for a
    batch a step (every step kept), the CPU-aware model's and the sleep model's
    predictions, the mean step, the GPU's idle share, the first batch."""

    WAIT_MS = "wait_ms"
    PREDICTED_WAIT_MS = "predicted_wait_ms"
    SLEEP_MODEL_WAIT_MS = "sleep_model_wait_ms"
    COMPUTE_MS = "compute_ms"
    IDLE_SHARE = "idle_share"
    FIRST_BATCH_S = FIRST_BATCH_S


_UNITS = {Quantity.IDLE_SHARE: "fraction", Quantity.FIRST_BATCH_S: "s"}


def mean_of(values: Sequence[float]) -> Figure:
    """Per-step figures headed by their mean, not their median: with W workers batches
    arrive in bursts (a long wait, then W-1 short ones), so the median wait can be 0
    while the GPU idles; the mean is what the idle share is made of."""
    figure = Figure.repeated(values)
    return replace(figure, value=statistics.fmean(values)) if values else figure


@dataclass(frozen=True)
class Point:
    """The sweep at one num_workers (ms unless said)."""

    workers: int
    wait_ms: Figure | None = None
    predicted_wait_ms: Figure | None = None
    sleep_model_wait_ms: Figure | None = None
    compute_ms: Figure | None = None
    idle_share: Figure | None = None  # fraction
    first_batch_s: Figure | None = None  # s

    def figure(self, quantity: Quantity) -> Figure | None:
        found: Figure | None = getattr(self, quantity.value)
        return found

    def value(self, quantity: Quantity) -> float | None:
        figure = self.figure(quantity)
        return None if figure is None else figure.value

    def metrics(self) -> Iterator[Metric]:
        for q in Quantity:
            figure = self.figure(q)
            if figure is not None:
                labels: Labels = {"quantity": q.value, "workers": self.workers}
                yield figure.metric(f"{q.value}.w{self.workers}", _UNITS.get(q, "ms"), labels)


@dataclass(frozen=True)
class StarveFigures:
    """Every figure of a starve sweep: the CPU time of a sample (as measured), then
    each worker count in the order measured."""

    sample_cpu_ms: Figure | None = None
    points: tuple[Point, ...] = ()

    def point(self, workers: int) -> Point | None:
        return next((p for p in self.points if p.workers == workers), None)

    def value(self, quantity: Quantity, workers: int) -> float | None:
        """One figure's value at a worker count; None where not in the run."""
        point = self.point(workers)
        return None if point is None else point.value(quantity)

    def idle(self) -> dict[int, float]:
        """The GPU's idle share by num_workers, where measured, by count."""
        out = {p.workers: v for p in self.points if (v := p.value(Quantity.IDLE_SHARE)) is not None}
        return dict(sorted(out.items()))

    def to_metrics(self) -> tuple[Metric, ...]:
        """The labelled metrics the JSON carries, in the order the stage writes them."""
        first = (
            []
            if self.sample_cpu_ms is None
            else [self.sample_cpu_ms.metric(SAMPLE_CPU_MS, "ms", {"quantity": SAMPLE_CPU_MS})]
        )
        return (*first, *(m for p in self.points for m in p.metrics()))

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> StarveFigures:
        """The figures a result holds (any this cannot read left out)."""
        sample: Figure | None = None
        points: dict[int, Point] = {}
        for m in metrics:
            labels, figure = labels_of(m), Figure.of(m)
            if figure is None:
                continue
            if labels.get("quantity") == SAMPLE_CPU_MS and "workers" not in labels:
                sample = figure
                continue
            cell = sweep_cell(m)
            if cell is None:
                continue
            workers, quantity = cell
            was = points.get(workers, Point(workers))
            # mypy checks a **mapping against every field; these names are Figure fields.
            points[workers] = replace(was, **{quantity.value: figure})  # type: ignore[arg-type]
        return cls(sample, tuple(points.values()))


def sweep_cell(m: Metric) -> tuple[int, Quantity] | None:
    """(num_workers, quantity) of a figure of the sweep (labelled with those two alone:
    `wait_ms.w2`); None for any other. The terminal and Markdown show these as one row
    a count (render/sweep.py)."""
    labels = labels_of(m)
    quantity = enum_of(Quantity, labels.get("quantity"))
    workers = count_of(labels.get("workers"))
    if quantity is None or workers is None or set(labels) != {"quantity", "workers"}:
        return None
    return workers, quantity
