"""How far a share counted from samples can be trusted: the Wilson score interval.

A share of n samples (py-spy's stacks, a second's readings) is a binomial proportion:
400 samples of a 68% share is +-5 points, 8 samples says little. Wilson's interval
keeps its bounds inside 0..1 and stays honest at 0%, 100% and small n, where the
normal approximation (p +- z*sqrt(p(1-p)/n)) collapses to a zero-width interval.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # the two-sided 95% point of the normal distribution


def wilson(hits: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The (low, high) Wilson score interval of `hits` out of `n` (95% by default);
    (0, 1) where there are no samples: nothing is known."""
    if n <= 0:
        return 0.0, 1.0
    hits = min(max(hits, 0.0), n)
    p = hits / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # exact at the edges: floating point can leave 1e-17 where the bound is 0 or 1
    low = 0.0 if hits == 0 else max(0.0, min(p, centre - half))
    high = 1.0 if hits == n else min(1.0, max(p, centre + half))
    return low, high


def side(low: float, high: float, threshold: float) -> int | None:
    """Which side of `threshold` an interval lies on: 1 above, -1 at or below, None
    where it straddles it (the samples cannot tell)."""
    if low > threshold:
        return 1
    if high <= threshold:
        return -1
    return None


def samples_needed(share: float, threshold: float, z: float = Z95, most: int = 1_000_000) -> int:
    """The fewest samples at which a share of `share` would lie wholly on one side of
    `threshold` (its Wilson interval not straddling it); `most` where no count does (a
    share at the threshold itself)."""
    if share == threshold:
        return most
    n = 1
    while n < most:
        low, high = wilson(share * n, n, z)
        if side(low, high, threshold) is not None:
            # doubling found a count that decides: bisect down to the first one
            lo = n // 2
            while lo + 1 < n:
                mid = (lo + n) // 2
                a, b = wilson(share * mid, mid, z)
                if side(a, b, threshold) is not None:
                    n = mid
                else:
                    lo = mid
            return n
        n *= 2
    return most


def percent(low: float, high: float) -> str:
    """An interval as people read it: `63-73%`."""
    return f"{low * 100:.0f}-{high * 100:.0f}%"


def effective_samples(hits: Sequence[bool]) -> float:
    """How many independent draws a time-ordered run of yes/no samples is worth, for
    the share of yes: n (1 - r) / (1 + r), r the lag-1 autocorrelation of a two-state
    chain (r = 1 - P(no to yes) - P(yes to no)). A wait sampled at 20 a second comes
    as runs of one long wait: a 300 ms wait is six samples of one event, not six draws
    (attach's 10 s window once said 17% (11-26%) of a rank whose own clock said 28%).
    Independent samples (r about 0) are worth n, as Wilson's interval counts them; a
    negative r (yes and no alternating) is never counted as more than n. A run that
    never changed (all yes, or all no) has no chain to read: worth n where it is all
    no (nothing seen to wait on; the share's interval at 0 stays Wilson's), one draw
    where it is all yes (one wait as long as the window)."""
    n = len(hits)
    if n < 2:
        return float(n)
    ones = sum(1 for h in hits if h)
    if ones == 0:
        return float(n)
    if ones == n:
        return 1.0
    up = down = from_no = from_yes = 0
    for a, b in itertools.pairwise(hits):
        if a:
            from_yes += 1
            down += not b
        else:
            from_no += 1
            up += bool(b)
    p_up = up / from_no if from_no else 0.0
    p_down = down / from_yes if from_yes else 0.0
    r = 1.0 - p_up - p_down
    if r <= 0:
        return float(n)
    return max(1.0, min(float(n), n * (1 - r) / (1 + r)))


def wilson_effective(
    hits: float, n: float, effective: float, z: float = Z95
) -> tuple[float, float]:
    """The Wilson interval of a share of `hits` in `n` samples worth `effective`
    independent draws (effective_samples): the share kept, the evidence scaled."""
    if n <= 0:
        return wilson(0.0, 0.0, z)
    e = max(1.0, min(float(effective), float(n)))
    return wilson(hits / n * e, e, z)
