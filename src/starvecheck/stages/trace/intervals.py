"""Interval arithmetic on sorted, disjoint lists of (start, end) (the output of
`union`), in microseconds."""

from __future__ import annotations

import bisect
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
