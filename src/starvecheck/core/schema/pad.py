"""pad's words: the strategy every other is measured against, and its parameters."""

from __future__ import annotations

from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import text, whole

IDEAL = "ideal"  # strategy: no padding at all, the bound the others are read against
LENGTH = "length"  # quantity: a sample's length in tokens (its percentiles)
ATTENTION_UNMASKED_VS_IDEAL = "attention_unmasked_vs_ideal"  # quantity


class Parameters(Base):
    current = text()  # the strategy trained with today
    context = whole(absent=0)
    lengths_source = text("source")  # where the lengths came from ("default": embedded)
