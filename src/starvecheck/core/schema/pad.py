"""pad's words: the strategy every other is measured against, its parameters, and
what a run leaves for the padding picture (PaddedRun: stages/pad fills it, render/plot
draws it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import text, whole

if TYPE_CHECKING:
    import numpy as np

    from starvecheck.core.model import StageResult

IDEAL = "ideal"  # strategy: no padding at all, the bound the others are read against
LENGTH = "length"  # quantity: a sample's length in tokens (its percentiles)
ATTENTION_UNMASKED_VS_IDEAL = "attention_unmasked_vs_ideal"  # quantity


class Parameters(Base):
    current = text()  # the strategy trained with today
    context = whole(absent=0)
    lengths_source = text("source")  # where the lengths came from ("default": embedded)


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
