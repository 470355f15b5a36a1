"""The pure rules that measuring and judging both need: where a throughput curve
stops rising, which worker counts idle the GPU as little as the best, what an overlap
ratio is called, and the thresholds behind them.

Below stages/ and advice/ alike, importing nothing of starvecheck's. A stage may use
these only to decide where to measure (the capacity measured at the worker count the
sweep says is enough); the recommendation a person reads is advice/'s
(`advice.workers.recommend_workers`), made from the same rules.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from starvecheck.core.paired import MARGIN, compare

# The knee of a throughput curve: the fewest workers that reach this share of the best.
KNEE_SHARE = 0.95

# A count read once at under this share of the best read beside it is settled as
# slower: more rounds could not lift it to KNEE_SHARE (a round's spread on a busy
# machine here is under 1.3x), so loader --factory reads it no more.
FAR_BELOW = 0.6

# GPU idle shares (starve) within this of the best are as good: the fewest such
# workers are enough. Workers past the CPUs count as a help only when they cut the
# idle share by more than this.
IDLE_AS_GOOD = 0.02

# The overlap experiment's reading of its ratio (pcie): at or above PARALLEL_AT the
# copy hides behind the CPU work (or the reverse); at or below SEQUENTIAL_AT the two
# take as long as one after the other.
PARALLEL_AT = 0.8
SEQUENTIAL_AT = 0.2


def within_cpus(curve: Mapping[int, float], effective_cpus: float) -> dict[int, float]:
    """The points of a curve at or below the effective CPUs (at least one): worker
    counts above them are never recommended for CPU work, since they take CPU time
    from the training process."""
    return {w: v for w, v in curve.items() if w <= max(1, effective_cpus)}


def knee(
    curve: Mapping[int, float], effective_cpus: float, share: float = KNEE_SHARE
) -> int | None:
    """The fewest workers whose throughput reaches `share` of the best measured at or
    below the effective CPUs; None when no such count was measured."""
    eligible = within_cpus(curve, effective_cpus)
    if not eligible:
        return None
    best = max(eligible.values())
    return min(w for w, v in eligible.items() if v >= share * best)


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a[i] / b[i], round by round, for the rounds both measured (figures of two
    configurations read side by side, so each ratio sees one state of the machine)."""
    return [x / y for x, y in zip(a, b, strict=False) if y > 0]


def paired_knee(
    rates: Mapping[int, Sequence[float]], effective_cpus: float, share: float = KNEE_SHARE
) -> int | None:
    """`knee` over figures read in interleaved rounds, at or below the effective CPUs:
    the most workers not clearly slower than the best count (the highest median) and
    with a median ratio to it of at least `share`, then the fewest as good as that
    count, round by round: a median ratio of at least `share` and a 90% interval whose
    low end is at least KNEE_LOW (core/paired.py). A count whose median is more than
    `share` under the best's is never named, however wide its rounds (MDS shards read
    0.73x at one worker on a busy machine and 1 was named).
    A fewer count is taken only on evidence: where the rounds disagree (a busy machine,
    few rounds) counts that may tie are settled towards the more workers, the same way
    run after run, and a short run and a long one name the same count."""
    eligible = {w: v for w, v in rates.items() if v and w <= max(1, effective_cpus)}
    if not eligible:
        return None
    best = max(eligible, key=lambda w: statistics.median(eligible[w]))
    top = max(
        w
        for w, v in eligible.items()
        if w == best
        or (not _worse(v, eligible[best], share) and _median_ratio(v, eligible[best]) >= share)
    )
    return min(
        w
        for w, v in eligible.items()
        if w == top
        or (
            w < top
            and _as_good(v, eligible[top], share)
            and _median_ratio(v, eligible[best]) >= share
        )
    )


# A fewer count is as good only where the interval of its ratio, round by round, has its
# low end at least this (and its median at least KNEE_SHARE).
KNEE_LOW = 0.90


def knee_settled(rates: Mapping[int, Sequence[float]], share: float = KNEE_SHARE) -> bool:
    """Whether more rounds could change what `paired_knee` says of these counts: each
    count is, against the best, either clearly slower (its interval's high end under
    1 - MARGIN) or as good (its median ratio at least `share` and its interval's low
    end at least KNEE_LOW); a count between the two is not settled. Read in rounds,
    a sweep stops once it is (loader --factory)."""
    read = {w: v for w, v in rates.items() if v}
    if len(read) < 2:
        return bool(read)
    best = max(read, key=lambda w: statistics.median(read[w]))
    for w, v in read.items():
        if w == best:
            continue
        c = compare(v, read[best])
        if c is not None and c.rounds == 1 < len(read[best]) and c.ratio < FAR_BELOW:
            continue  # read once, far below a best read again: settled (far_below)
        if c is None or c.rounds < 2:
            return False
        if not (c.high < 1.0 - MARGIN or (c.ratio >= share and c.low >= KNEE_LOW)):
            return False
    return True


def far_below(rates: Mapping[int, Sequence[float]], keep: int | None = None) -> set[int]:
    """The counts whose one round read so far lies under FAR_BELOW of the best count's
    in that round: settled as slower, read no more (not `keep`, the configuration the
    others' gain is read against)."""
    firsts = {w: v[0] for w, v in rates.items() if v}
    if not firsts:
        return set()
    top = max(firsts.values())
    return {w for w, v in firsts.items() if w != keep and v < FAR_BELOW * top}


def variants_settled(variants: Sequence[Sequence[float]], base: Sequence[float]) -> bool:
    """Whether more rounds could change which variants beat `base` beyond the margin:
    each one's interval over it lies wholly on one side of 1 + MARGIN."""
    for v in variants:
        c = compare(v, base)
        if c is None or c.rounds < 2:
            return False
        if c.low < 1.0 + MARGIN <= c.high:
            return False
    return True


def _median_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    r = ratios(a, b)
    return statistics.median(r) if r else 0.0


def _worse(a: Sequence[float], best: Sequence[float], share: float) -> bool:
    """Clearly slower than the best: its interval's high end under 1 - MARGIN; with one
    round (no interval), its ratio under `share`."""
    c = compare(a, best)
    if c is None:
        return True
    return c.below() if c.rounds >= 2 else c.ratio < share


def _as_good(a: Sequence[float], than: Sequence[float], share: float) -> bool:
    c = compare(a, than)
    return c is not None and c.ratio >= share and (c.rounds < 2 or c.low >= KNEE_LOW)


# Workers whose CPU time is at least this share of their time not spent waiting for a
# CPU do CPU work; less, and they mostly wait (I/O, sleep, a full prefetch queue).
CPU_WORK_SHARE = 0.5


def cpu_work(cpu_s: float | None, runq_s: float | None, alive_s: float | None) -> bool | None:
    """Whether workers spend their time on CPU work, from their measured seconds: on a
    CPU, runnable on a run queue (waiting for a CPU another process holds: CPU work
    they could not get, never I/O), alive. What is left is blocked: I/O or sleep. None
    where a figure is missing: callers take that as CPU work, the safe side."""
    if cpu_s is None or runq_s is None or alive_s is None or alive_s <= 0:
        return None
    blocked = max(0.0, alive_s - cpu_s - runq_s)
    return cpu_s >= CPU_WORK_SHARE * (cpu_s + blocked)


def least_idle(
    idle: Mapping[int, float], effective_cpus: float, as_good: float = IDLE_AS_GOOD
) -> int | None:
    """The fewest workers whose GPU idle share is within `as_good` of the best measured
    at or below the effective CPUs; None when no such count was measured."""
    eligible = within_cpus(idle, effective_cpus)
    if not eligible:
        return None
    best = min(eligible.values())
    return min(w for w, v in eligible.items() if v <= best + as_good)


def overlap_verdict(ratio: float | None) -> str:
    """PARALLEL, PARTIAL or SEQUENTIAL for an overlap ratio; UNKNOWN without one."""
    if ratio is None:
        return "UNKNOWN"
    if ratio >= PARALLEL_AT:
        return "PARALLEL"
    if ratio <= SEQUENTIAL_AT:
        return "SEQUENTIAL"
    return "PARTIAL"
