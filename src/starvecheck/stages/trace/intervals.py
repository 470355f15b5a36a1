"""Interval arithmetic on sorted, disjoint lists of (start, end) (the output of
`union`), in microseconds. `Cover` answers "how much of [lo, hi) is covered" in
O(log n) whatever [lo, hi) spans, so cutting a timeline into steps costs the same
whether the steps follow one another or all overlap."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def clip(merged: Sequence[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of `merged` inside [lo, hi); a bisection, so per-step cuts of a long
    trace stay O(log n) each."""
    ends = _Ends(merged)
    i = bisect.bisect_right(ends, lo)
    out = []
    while i < len(merged) and merged[i][0] < hi:
        a, b = max(merged[i][0], lo), min(merged[i][1], hi)
        if b > a:
            out.append((a, b))
        i += 1
    return out


class _Ends(Sequence[float]):
    """The end times of a merged list, as a sequence bisect can search without a copy."""

    def __init__(self, merged: Sequence[Interval]) -> None:
        self.merged = merged

    def __len__(self) -> int:
        return len(self.merged)

    def __getitem__(self, i: Any) -> Any:
        return self.merged[i][1]


def length(merged: Iterable[Interval]) -> float:
    return sum(b - a for a, b in merged)


def overlap(x: Sequence[Interval], y: Sequence[Interval]) -> float:
    """Total time in both of two merged lists."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            total += b - a
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def gaps(merged: Sequence[Interval], lo: float, hi: float) -> list[Interval]:
    """The time in [lo, hi) that `merged` does not cover."""
    out = []
    at = lo
    for a, b in clip(merged, lo, hi):
        if a > at:
            out.append((at, a))
        at = b
    if hi > at:
        out.append((at, hi))
    return out


def intersect(x: Sequence[Interval], y: Sequence[Interval]) -> list[Interval]:
    """The time in both of two merged lists, itself a merged list."""
    out: list[Interval] = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


class Cover:
    """A merged list with its running total: `within(lo, hi)` is
    `length(clip(merged, lo, hi))` by two bisections, not a walk over the intervals."""

    def __init__(self, merged: Sequence[Interval]) -> None:
        self.merged = list(merged)
        self.starts = [a for a, _ in self.merged]
        self.ends = [b for _, b in self.merged]
        # before[i]: the summed length of the first i intervals.
        self.before = [0.0, *itertools.accumulate(b - a for a, b in self.merged)]

    def __bool__(self) -> bool:
        return bool(self.merged)

    @property
    def total(self) -> float:
        return self.before[-1]

    def within(self, lo: float, hi: float) -> float:
        """The covered time in [lo, hi)."""
        i = bisect.bisect_right(self.ends, lo)  # the first interval that ends after lo
        j = bisect.bisect_left(self.starts, hi)  # the intervals that start before hi
        if i >= j:
            return 0.0
        # The whole intervals i..j-1, less the part of the first before lo and of the
        # last after hi.
        total = self.before[j] - self.before[i]
        total -= max(0.0, lo - self.starts[i]) + max(0.0, self.ends[j - 1] - hi)
        return max(0.0, total)
