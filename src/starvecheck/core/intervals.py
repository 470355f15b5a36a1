"""How far a share counted from samples can be trusted: the Wilson score interval.

A share of n samples (py-spy's stacks, a second's readings) is a binomial proportion:
400 samples of a 68% share is +-5 points, 8 samples says little. Wilson's interval
keeps its bounds inside 0..1 and stays honest at 0%, 100% and small n, where the
normal approximation (p +- z*sqrt(p(1-p)/n)) collapses to a zero-width interval.
"""

from __future__ import annotations

import math

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
