"""Two configurations compared as a careful benchmarker compares them on a machine that
is not quiet: read side by side in interleaved rounds (stages/loader/factory/stage.py),
compared round by round, and a change recommended only when the interval of the
ratios clears no-change by a stated margin.

Each round reads every configuration once, seconds apart, so a machine whose other work
comes and goes slows both alike: the ratio of their samples/s in one round holds where
their figures do not. The comparison is the median of the per-round ratios (a round in
which the machine stalled one configuration does not set the figure; with two rounds,
their geometric mean), with a 90% interval from Student's t over their logarithms (few
rounds, so t, not the normal law; a stalled round widens it), which holds the median;
a gain counts only where the interval's low end is above 1 + MARGIN. More rounds
narrow the interval: a short run (--quick) may fail to clear the margin where a longer
one clears it, but the two never point opposite ways, since both read the same rounds'
kind of evidence and the longer one is the more certain.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# A change is recommended only where the interval's low end is above 1 + MARGIN: a gain
# smaller than this is inside what a training loop's own noise hides, and the interval
# protects against reading noise as a gain.
MARGIN = 0.05
# Two-sided 90% quantiles of Student's t by degrees of freedom (rounds less one).
_T90 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833}
_T90_MANY = 1.812  # 10 and more


@dataclass(frozen=True)
class Comparison:
    """A over B: the median of the per-round ratios, its 90% interval, the rounds it
    rests on."""

    ratio: float
    low: float
    high: float
    rounds: int

    def clears(self, margin: float = MARGIN) -> bool:
        """A is faster than B beyond the noise and the margin."""
        return self.low >= 1.0 + margin

    def undecided(self, margin: float = MARGIN) -> bool:
        """A gain past the margin by the median, not clear of it by the interval, and
        one worth making (twice the margin) inside it: more rounds may tell (loader
        --factory reads on; judging says it could not tell, never a pass). A median
        under the margin is no change, whatever the interval's reach."""
        return (
            not self.clears(margin) and self.ratio >= 1.0 + margin and self.high >= 1.0 + 2 * margin
        )

    def below(self, margin: float = MARGIN) -> bool:
        """A is slower than B beyond the noise and the margin."""
        return self.high <= 1.0 - margin

    def describe(self) -> str:
        """`1.51x (1.44x-1.58x over 5 rounds)`; one round: no interval."""
        if self.rounds < 2:
            return f"{self.ratio:.2f}x (one round: no interval)"
        return f"{self.ratio:.2f}x ({self.low:.2f}x-{self.high:.2f}x over {self.rounds} rounds)"


def compare(a: Sequence[float], b: Sequence[float]) -> Comparison | None:
    """A's figures over B's, round by round (index i of each is round i); None where
    no round has both."""
    logs = [math.log(x / y) for x, y in zip(a, b, strict=False) if x > 0 and y > 0]
    if not logs:
        return None
    mean, mid = statistics.fmean(logs), statistics.median(logs)
    if len(logs) < 2:
        return Comparison(math.exp(mean), 0.0, math.inf, len(logs))
    half = _T90.get(len(logs) - 1, _T90_MANY) * statistics.stdev(logs) / math.sqrt(len(logs))
    low, high = min(mean - half, mid), max(mean + half, mid)
    return Comparison(math.exp(mid), math.exp(low), math.exp(high), len(logs))


def chained(first: Comparison, then: Comparison) -> Comparison:
    """A over C from A over B and B over C, each read in its own rounds: the ratios
    multiply, and so, to be safe, do the ends of the intervals."""
    return Comparison(
        first.ratio * then.ratio,
        first.low * then.low,
        first.high * then.high,
        min(first.rounds, then.rounds),
    )


def spread(values: Sequence[float]) -> float | None:
    """The largest over the smallest of one configuration's figures across rounds: how
    much the machine moved it."""
    known = [v for v in values if v > 0]
    return max(known) / min(known) if len(known) >= 2 else None
