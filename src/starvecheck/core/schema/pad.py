"""pad's words: the strategies (enum), the strategy every other is measured against,
its parameters, its figures as records (`PadFigures`: the lengths fed, and each
strategy's cost), and what a run leaves for the padding picture (PaddedRun: stages/pad
fills it, render/plot draws it).

The stage fills a `PadFigures` once; the JSON is its serialisation: `to_metrics()`
writes the labelled metrics of schema 2 and 3 (names, labels, units, values, order),
`from_metrics()` reads them back by their labels, from a fresh result or a stored
report alike (`StageResult.records`), never raising: what it cannot read is left out.
The metrics' names are spelled here alone."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import Metric
from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import text, whole
from starvecheck.core.schema.figure import Figure, value_of
from starvecheck.core.strategies import STRATEGIES

if TYPE_CHECKING:
    import numpy as np

    from starvecheck.core.model import StageResult

IDEAL = "ideal"  # strategy: no padding at all, the bound the others are read against
LENGTH = "length"  # quantity: a sample's length in tokens (its percentiles)
ATTENTION_COST = "attention_cost"  # quantity: sum of squared attended lengths
ATTENTION_UNMASKED_VS_IDEAL = "attention_unmasked_vs_ideal"  # quantity


class Parameters(Base):
    current = text()  # the strategy trained with today
    context = whole(absent=0)
    lengths_source = text("source")  # where the lengths came from ("default": embedded)


class Strategy(StrEnum):
    """A batching strategy (core/strategies.py names them, in the order people read)."""

    PAD_TO_CONTEXT = "pad_to_context"
    DYNAMIC = "dynamic"
    DYNAMIC_MULT8 = "dynamic_mult8"
    DYNAMIC_MULT64 = "dynamic_mult64"
    LENGTH_GROUPED = "length_grouped"
    PADDING_FREE = "padding_free"
    GREEDY_PACK = "greedy_pack"
    FFD_PACK = "ffd_pack"
    BFD_PACK = "bfd_pack"


assert tuple(Strategy) == STRATEGIES


class Statistic(StrEnum):
    """A statistic of the samples' lengths (the `statistic` of `length`)."""

    MEAN = "mean"
    MEDIAN = "median"
    P90 = "p90"
    P99 = "p99"
    MIN = "min"
    MAX = "max"


# A strategy's figures in the order the stage writes them, and their units.
COST_UNITS = {
    "efficiency": "fraction", "padding_positions": "positions",
    "positions_per_batch": "positions", "max_positions_per_batch": "positions",
    "batches": "batches", ATTENTION_COST: "token²", "attention_vs_ideal": "x",
    ATTENTION_UNMASKED_VS_IDEAL: "x",
}  # fmt: skip
# The counts of the lengths fed, in the order the stage writes them (the statistics of
# `length` between tokens and truncated_samples), and their units.
COUNT_UNITS = {
    "samples": "samples", "tokens": "tokens", "truncated_samples": "samples",
    "truncated_tokens": "tokens", "empty_samples": "samples",
}  # fmt: skip


@dataclass(frozen=True)
class Cost:
    """What one strategy costs over an epoch: real tokens per computed position
    (efficiency), padding, positions per batch (mean and largest), batches, attention
    (sum of squared attended lengths) and its ratio to the ideal's, and, where samples
    share a row, that ratio without a per-document mask. Figures laid out over several
    shuffles carry their runs."""

    strategy: Strategy
    efficiency: Figure | None = None
    padding_positions: Figure | None = None
    positions_per_batch: Figure | None = None
    max_positions_per_batch: Figure | None = None
    batches: Figure | None = None
    attention_cost: Figure | None = None
    attention_vs_ideal: Figure | None = None
    attention_unmasked_vs_ideal: Figure | None = None

    def metrics(self) -> Iterator[Metric]:
        for quantity, unit in COST_UNITS.items():
            figure: Figure | None = getattr(self, quantity)
            if figure is not None:
                labels = {"quantity": quantity, "strategy": self.strategy.value}
                yield figure.metric(f"{quantity}.{self.strategy.value}", unit, labels)


@dataclass(frozen=True)
class Lengths:
    """The samples' lengths as laid out (cut to the context): how many samples and
    tokens, the statistics of a length (as read, empty samples left out), and how many
    samples and tokens the context cut, and how many empty samples were left out."""

    samples: Figure | None = None
    tokens: Figure | None = None
    mean: Figure | None = None
    median: Figure | None = None
    p90: Figure | None = None
    p99: Figure | None = None
    min: Figure | None = None
    max: Figure | None = None
    truncated_samples: Figure | None = None
    truncated_tokens: Figure | None = None
    empty_samples: Figure | None = None

    def statistic(self, statistic: Statistic) -> Figure | None:
        figure: Figure | None = getattr(self, statistic.value)
        return figure

    def metrics(self) -> Iterator[Metric]:
        counts = list(COUNT_UNITS)
        for quantity in counts[:2]:
            yield from self._count(quantity)
        for statistic in Statistic:
            figure = self.statistic(statistic)
            if figure is not None:
                labels = {"quantity": LENGTH, "statistic": statistic.value}
                yield figure.metric(f"{LENGTH}.{statistic.value}", "tokens", labels)
        for quantity in counts[2:]:
            yield from self._count(quantity)

    def _count(self, quantity: str) -> Iterator[Metric]:
        figure: Figure | None = getattr(self, quantity)
        if figure is not None:
            yield figure.metric(quantity, COUNT_UNITS[quantity], {"quantity": quantity})


@dataclass(frozen=True)
class PadFigures:
    """Every figure of a pad run: the lengths fed, the ideal's attention (every sample
    attending to itself alone, no padding) and each strategy's cost, in the order laid
    out."""

    lengths: Lengths = field(default_factory=Lengths)
    ideal_attention: Figure | None = None
    costs: tuple[Cost, ...] = ()

    def cost(self, strategy: str) -> Cost | None:
        """The strategy's cost, None where not in the run."""
        return next((c for c in self.costs if c.strategy == strategy), None)

    def efficiencies(self) -> dict[Strategy, float]:
        """Each strategy's real tokens per computed position, where known, in the order
        people read them (core/strategies.py)."""
        out: dict[Strategy, float] = {}
        for s in Strategy:
            cost = self.cost(s)
            if (x := value_of(cost.efficiency if cost is not None else None)) is not None:
                out[s] = x
        return out

    def to_metrics(self) -> tuple[Metric, ...]:
        """The labelled metrics the JSON carries, in the order the stage writes them."""
        ideal, labels = self.ideal_attention, {"quantity": ATTENTION_COST, "strategy": IDEAL}
        name = f"{ATTENTION_COST}.{IDEAL}"
        return (
            *self.lengths.metrics(),
            *([] if ideal is None else [ideal.metric(name, COST_UNITS[ATTENTION_COST], labels)]),
            *(m for c in self.costs for m in c.metrics()),
        )

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> PadFigures:
        """The figures a result holds (other stages' metrics, and any this cannot read,
        left out). Where a figure is there twice, the first is read."""
        lengths: dict[str, Figure] = {}
        ideal: Figure | None = None
        costs: dict[Strategy, dict[str, Figure]] = {}
        for m in metrics:
            figure = Figure.of(m)
            labels = m.labels if isinstance(m.labels, Mapping) else {}
            quantity, strategy = labels.get("quantity"), labels.get("strategy")
            statistic = labels.get("statistic")
            if figure is None or not isinstance(quantity, str):
                continue
            if quantity == ATTENTION_COST and strategy == IDEAL:
                ideal = figure if ideal is None else ideal
            elif quantity in COST_UNITS and strategy in set(Strategy):
                costs.setdefault(Strategy(str(strategy)), {}).setdefault(quantity, figure)
            elif quantity in COUNT_UNITS:
                lengths.setdefault(quantity, figure)
            elif quantity == LENGTH and statistic in set(Statistic):
                lengths.setdefault(str(statistic), figure)
        return cls(Lengths(**lengths), ideal, tuple(Cost(s, **held) for s, held in costs.items()))

    @staticmethod
    def holds(m: Metric) -> bool:
        """Whether a metric is one of pad's figures: a strategy's cost, or one of the
        lengths' (what the table and the line under it take)."""
        labels = m.labels if isinstance(m.labels, Mapping) else {}
        quantity, strategy = labels.get("quantity"), labels.get("strategy")
        if quantity == ATTENTION_COST and strategy == IDEAL:
            return True
        if quantity in COST_UNITS and strategy in set(Strategy):
            return True
        return quantity == LENGTH or quantity in COUNT_UNITS

    @staticmethod
    def is_cost(m: Metric) -> bool:
        """Whether a metric is a strategy's cost (a row of the table)."""
        labels = m.labels if isinstance(m.labels, Mapping) else {}
        return labels.get("quantity") in COST_UNITS and labels.get("strategy") in set(Strategy)


class PaddedLayout(Protocol):
    """What the padding picture reads of a batching strategy's layout (the pad stage's
    packing.Layout keeps it): which row each sample went to, in which order, and each
    row's positions. Declared here, in the vocabulary: stages/ fills it, render/ (which
    never imports stages/) draws it."""

    order: np.ndarray  # which sample goes where, in order
    row: np.ndarray  # each sample's row
    row_len: np.ndarray  # each row's tokens
    rows_per_batch: int

    @property
    def rows(self) -> int: ...

    @property
    def batches(self) -> int: ...

    def row_tokens(self, lengths: np.ndarray) -> np.ndarray: ...


class PaddedRun(Protocol):
    """What the padding picture reads of a pad run (the pad stage's Run keeps it)."""

    result: StageResult
    lengths: np.ndarray  # each sample's length in tokens
    layouts: Mapping[str, PaddedLayout]
