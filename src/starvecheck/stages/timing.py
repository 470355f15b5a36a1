"""Warm-up, repeat, and the warnings that say when a figure is not to be trusted.

Modelled on pyperf: warm-ups are run and thrown away, measured runs are kept raw,
and the spread decides whether the figure is stable enough to act on.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starvecheck.core import clocks
from starvecheck.core.metric import Caveat

# pyperf warns at a standard deviation of 10% of the mean; we use the median,
# which one slow run (a page-cache miss, a neighbour's burst) moves less.
UNSTABLE_SPREAD = 0.10
MIN_RUNS = 3
# Below this many values, MAD-based outlier tests flag any value that differs from
# two equal ones; the spread warning covers small sets instead.
MIN_OUTLIER_VALUES = 5


@dataclass(frozen=True)
class Timed:
    warmups: tuple[float, ...]
    values: tuple[float, ...]  # seconds per measured run


def repeat(
    fn: Callable[[], object],
    *,
    runs: int,
    warmups: int = 1,
    clock: Callable[[], float] = clocks.perf_counter,
) -> Timed:
    """Run `fn` `warmups` times unmeasured, then `runs` times measured by `clock`."""
    if runs < 1 or warmups < 0:
        raise ValueError("runs must be >= 1 and warmups >= 0")
    warm: list[float] = []
    vals: list[float] = []
    for i in range(warmups + runs):
        start = clock()
        fn()
        elapsed = clock() - start
        (warm if i < warmups else vals).append(elapsed)
    return Timed(tuple(warm), tuple(vals))


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation: a spread that outliers barely move (as hyperfine uses)."""
    med = statistics.median(values)
    return statistics.median(abs(v - med) for v in values)


def outliers(values: Sequence[float], threshold: float = 3.5) -> list[int]:
    """Indices of values whose modified z-score (Iglewicz and Hoaglin) exceeds `threshold`."""
    if len(values) < MIN_OUTLIER_VALUES:
        return []
    med = statistics.median(values)
    spread = mad(values)
    if spread == 0:
        return [i for i, v in enumerate(values) if v != med]
    return [i for i, v in enumerate(values) if abs(0.6745 * (v - med) / spread) > threshold]


def stability_warnings(values: Sequence[float], what: str = "runs") -> list[str]:
    """Reasons a set of repeated measurements should not be trusted, each with the fix."""
    warnings: list[str] = []
    n = len(values)
    if n == 0:
        return [f"no {what} completed"]
    if n < MIN_RUNS:
        warnings.append(
            f"only {n} {what}: too few to judge the spread; use --runs {MIN_RUNS} or more"
        )
        return warnings
    med = statistics.median(values)
    if med > 0:
        spread = statistics.stdev(values) / med
        if spread >= UNSTABLE_SPREAD:
            warnings.append(
                f"{what} vary by {spread:.0%} of the median (stdev/median): a noisy machine "
                "or a changing cache; close other work and add runs"
            )
    bad = outliers(values)
    if bad:
        warnings.append(f"{len(bad)} of {n} {what} are outliers (modified z-score > 3.5)")
    return warnings


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) of already sorted values, interpolating linearly
    between the two nearest ranks (numpy's default, 'linear')."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError("p must be within 0..100")
    pos = (len(sorted_values) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


# --- caveats several stages share, built in one place (as hyperfine's warnings enum) --
# Each is a `Caveat` with a stable id that judging can test for; the text is what
# people read. Stages pass what differs (what they repeat, what likely disturbed it).

# The remedy names the commands that have --runs: doctor, which shares these caveats,
# has none of its own (a run of io, loader or pcie alone takes it).
MORE_RUNS = "add runs (`--runs` of io, loader and pcie)"
NOISY_MACHINE = (
    f"a noisy machine or a cache changing under the runs: close other work and {MORE_RUNS}"
)


def unstable(entries: Sequence[str], what: str = "runs", cause: str = NOISY_MACHINE) -> Caveat:
    """`entries` ("shard.random.cold.t2 12%", ...) varied by UNSTABLE_SPREAD or more,
    or held outliers."""
    return Caveat(
        "timing.unstable",
        f"{what} vary by 10% or more of the median (stdev/median), or hold outliers: "
        + ", ".join(entries)
        + f"; {cause}",
    )


def too_few_runs(text: str) -> Caveat:
    """Too few repeats to judge the spread; `text` says how many and the fix."""
    return Caveat("timing.too-few-runs", text)


def first_cold_slower(name: str, first_mbps: float, rest_mbps: float) -> Caveat:
    return Caveat(
        "cache.first-cold-slower",
        f"{name}: the first cold run read at {first_mbps:,.0f} MB/s, later ones at "
        f"{rest_mbps:,.0f}: a cache below this kernel (hypervisor, storage array, "
        "NFS server) kept the data after the first read, so the median is "
        "optimistic for a first epoch",
    )


def not_cold(text: str) -> Caveat:
    """Pages were still cached when a cold run began; `text` says how much and where."""
    return Caveat("cache.not-cold", text)


def hypervisor_cache(text: str) -> Caveat:
    """Cold figures under a hypervisor, which may cache the virtual disk itself; `text`
    is the stage's own sentence."""
    return Caveat("cache.hypervisor", text)
