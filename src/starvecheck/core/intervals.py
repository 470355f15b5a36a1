"""How far a share counted from samples can be trusted: the Wilson score interval.

A share of n samples (py-spy's stacks, a second's readings) is a binomial proportion:
400 samples of a 68% share is +-5 points, 8 samples says little. Wilson's interval
keeps its bounds inside 0..1 and stays honest at 0%, 100% and small n, where the
normal approximation (p +- z*sqrt(p(1-p)/n)) collapses to a zero-width interval.

Wilson's counts each sample as an independent draw. Samples taken in time are not
where what they see lasts longer than the gap between them: a wait of 300 ms sampled
at 20 a second is six samples of one event. `effective_samples` says what such
samples are worth, from their runs (a stretch of yes and the no after it, the
independent units); `wilson_effective` is Wilson's interval at that worth. For
independent samples the worth is about n and the interval Wilson's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Worth:
    """What time-ordered samples are worth for a share (`worth`): `effective`
    independent draws, read from `runs` runs of `samples` samples; `clustered`, from 0
    to 1, how far longer their runs of yes are than independent samples would make
    them (0: as a coin's, 1/(1-p) long on average; 1: far longer)."""

    samples: int
    effective: float
    runs: int
    clustered: float = 0.0

    @property
    def z(self) -> float:
        """The interval's multiplier: the normal's 95% point where the samples look
        independent (Wilson's, which knows its variance from the share), the t
        distribution's on the runs where their runs of yes are long (the variance was
        read off the runs themselves, and two runs say little of it), in proportion
        between (`clustered`). A few lone yes are not long runs: their interval stays
        Wilson's, however few runs they make."""
        if self.runs < 2 or self.clustered <= 0:
            return Z95
        return Z95 + (t95(self.runs - 1) - Z95) * min(1.0, self.clustered)


def worth(*series: Sequence[float]) -> Worth:
    """How many independent draws time-ordered samples are worth, for the share of
    their total (each sample 1 or 0, yes or no; or a weight between, a sample counted
    in part). Samples of one long wait are not independent: at 20 a second a 300 ms
    wait is six samples of one event, and attach's 10 s window once said 17% (11-26%)
    of a rank whose own clock said 28%.

    So the samples are cut into runs, each a stretch of yes and the no after it (a
    series' first stretch starts with its first sample), and the runs are the draws:
    the share is a ratio of sums over them, sum(yes) / sum(samples), whose variance
    is var(yes - share x samples) over the runs, k/(k-1) x sum((y - p c)^2) / n^2
    (the ratio estimator's, as regenerative simulation reads its cycles). The count
    worth it is p(1-p) over that variance: independent samples come out near n
    (their runs are short and as variable as a coin's); a wait whose runs are as long
    as each other (a 400 ms read every tenth step) stays near n too, since its share
    moves only with whole runs; runs of very different lengths (300 ms, then 3 s) are
    worth a few. Never more than the samples (Wilson's interval on all of them is the
    narrowest given), never under one. A share of 0 (nothing seen) is worth every
    sample, Wilson's interval at 0; a series all yes is one draw (one wait as long as
    the window), each of several series one; a single run (a series that starts with
    its only wait: no second stretch to compare it with) one event in a window of 1/p
    runs of its length (a lone sample of 400, 400; a wait of 5 samples of 400, 80);
    samples all counted the same part (a weight) every sample, nothing in them varies.
    Several `series` (processes sampled apart) pool their runs."""
    n = sum(len(s) for s in series)
    if n < 2:
        return Worth(n, float(n), n)
    total = sum(_weight(v) for s in series for v in s)
    p = total / n
    runs = [run for s in series for run in _runs(s)]
    k = len(runs)
    if p <= 0:
        return Worth(n, float(n), k)
    if p >= 1:
        return Worth(n, float(max(1, min(n, k))), k, 1.0)
    # the runs of yes: how much longer than a coin's (1/(1-p) on average)
    yes_runs = sum(1 for y, _ in runs if y > 0)
    clustered = max(0.0, min(1.0, 1.0 - 1.0 / ((1 - p) * (total / yes_runs))))
    if len({_weight(v) for s in series for v in s}) == 1:
        return Worth(n, float(n), k)  # every sample the same part: nothing varies
    if k < 2:  # one run: one event seen, the window 1/p runs of its length
        return Worth(n, max(1.0, min(float(n), 1.0 / p)), k, clustered)
    spread = sum((y - p * c) ** 2 for y, c in runs)
    if spread <= 0:
        return Worth(n, float(n), k, clustered)
    variance = k / (k - 1) * spread / (n * n)
    return Worth(n, max(1.0, min(float(n), p * (1 - p) / variance)), k, clustered)


def effective_samples(*series: Sequence[float]) -> float:
    """What the samples are worth as independent draws (`worth`)."""
    return worth(*series).effective


# The t distribution's two-sided 95% points for 1-10 degrees of freedom; past 10, its
# Cornish-Fisher expansion about the normal's (within 0.001 there).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t95(df: int) -> float:
    """The two-sided 95% point of Student's t with `df` degrees of freedom."""
    if df < 1:
        return math.inf
    if df <= len(_T95):
        return _T95[df - 1]
    z = Z95
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def _weight(v: float) -> float:
    x = float(v)
    return min(1.0, max(0.0, x)) if math.isfinite(x) else 0.0


def _runs(samples: Sequence[float]) -> list[tuple[float, int]]:
    """(the yes in it, its samples) of each stretch: a run of yes and the no after
    it; a new one starts where yes follows no."""
    out: list[tuple[float, int]] = []
    yes, count, before = 0.0, 0, 0.0
    for v in samples:
        w = _weight(v)
        if count and w > 0 and before <= 0:
            out.append((yes, count))
            yes, count = 0.0, 0
        yes += w
        count += 1
        before = w
    if count:
        out.append((yes, count))
    return out


def wilson_effective(
    hits: float, n: float, effective: float, z: float = Z95
) -> tuple[float, float]:
    """The Wilson interval of a share of `hits` in `n` samples worth `effective`
    independent draws (effective_samples): the share kept, the evidence scaled."""
    if n <= 0:
        return wilson(0.0, 0.0, z)
    e = max(1.0, min(float(effective), float(n)))
    return wilson(hits / n * e, e, z)


def interval(hits: float, n: float, w: Worth) -> tuple[float, float]:
    """The 95% interval of a share of `hits` in `n` samples worth `w` (`worth`):
    Wilson's at what they are worth, with its multiplier (`Worth.z`)."""
    return wilson_effective(hits, n, w.effective, w.z)


def seconds_to_decide(
    share: float, w: Worth, seconds: float, threshold: float, most: float = 3600.0
) -> float | None:
    """The shortest window, in seconds, at which a share like `share` would lie wholly
    on one side of `threshold`: its samples (`w`, over `seconds`) coming as fast, worth
    as much a second, their runs as many a second (as the window grows the runs grow
    with it, and the multiplier moves back toward the normal's). Tried on a grid of a
    fifth of a doubling; None where no window up to `most` decides (a share at the
    threshold never does)."""
    if share == threshold or seconds <= 0 or w.samples <= 0 or w.effective <= 0:
        return None
    t = seconds
    while t <= most:
        k = t / seconds
        longer = Worth(max(1, round(w.samples * k)), w.effective * k,
                       max(1, round(w.runs * k)), w.clustered)  # fmt: skip
        low, high = interval(share * longer.samples, longer.samples, longer)
        if side(low, high, threshold) is not None:
            return t
        t *= 2**0.2
    return None
