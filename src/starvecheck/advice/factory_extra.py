"""`loader --factory`'s settings second to the worker count (advice/factory.py): prefetch_factor,
persistent_workers or pin_memory toggled at the chosen count and read beside it
(`base`), joining the recommended line only past a higher bar than the count's, so
that a saving at the edge of it does not join one run's line and not the next one's."""

from __future__ import annotations

import statistics

from starvecheck.advice.configurations import Point
from starvecheck.core.paired import Comparison, compare
from starvecheck.core.schema.factory import VARIANTS, Role

# A setting second to the worker count (prefetch_factor, persistent_workers) joins the
# line only where its interval is above 1 + this.
EXTRA_MARGIN = 0.10
# persistent_workers: recommended when a later epoch starts this much sooner, and this
# share of an epoch (the bar of every setting second to the count: a saving at the
# edge of it joins one run's line and not the next one's).
EPOCH_START_SAVED_S = 0.05
EPOCH_SHARE = EXTRA_MARGIN


def extra_setting(
    found: list[Point], base: Point, dataset_samples: int | None = None, how: str | None = None
) -> tuple[Point, str] | None:
    """prefetch_factor, persistent_workers or pin_memory toggled (with CUDA: every batch
    copied to the device) at the chosen count, read beside the count itself (`base`):
    where its samples/s clear EXTRA_MARGIN over the count's, round by round; persistent
    workers also where every later epoch starts sooner (_sooner). Held to a higher bar
    than the count, so it joins the line run after run or not at all; never slower."""
    if not base.workers:
        return None
    beside = next((p for p in found if p.role == Role.BASE and p.workers == base.workers), None)
    if beside is None:
        return None
    best: tuple[Point, str, float] | None = None
    for p in found:
        if p.workers != base.workers or p.role not in VARIANTS:
            continue
        c = compare(p.rates, beside.rates)
        if c is None or c.below(0.0):
            continue  # slower than the count alone: never part of the line
        note = ""
        if c.clears(EXTRA_MARGIN):
            what = {
                Role.PREFETCH: f"prefetch_factor={p.settings.prefetch_factor}",
                Role.PERSISTENT: "persistent_workers=True",
                Role.PIN: f"pin_memory={p.settings.pin_memory}",
            }[p.role]
            note = f"{what} measured {c.describe()} the samples/s of the count alone" + (
                ", each batch copied to the device as the loop does" if p.role == Role.PIN else ""
            )
        elif p.role == Role.PERSISTENT and c.high >= 1.0:
            note = _sooner(p, beside, c, dataset_samples, how)
        if note and (best is None or c.ratio > best[2]):
            best = (p, note, c.ratio)
    return None if best is None else (best[0], best[1])


def _sooner(
    p: Point, beside: Point, c: Comparison, dataset_samples: int | None, how: str | None = None
) -> str:
    """Why persistent workers join: each later epoch starts sooner, by enough of it
    (`how`: their start method), beyond the epochs' spread (_starts): a saving at the
    edge of the bar, which other work moves, does not join one run's line and not the next's."""
    before, after = _starts(beside), _starts(p)
    if before is None or after is None or not dataset_samples or beside.rate <= 0:
        return ""
    saved, surely = before[0] - after[0], before[1] - after[2]
    epoch = dataset_samples / beside.rate
    if surely < max(EPOCH_START_SAVED_S, EPOCH_SHARE * epoch):
        return ""
    return (
        f"persistent_workers=True starts each later epoch in {after[0]:.2f} s instead of "
        f"{before[0]:.2f} s (its workers are not started again"
        + (f" under {how}" if how else "")
        + f"): {saved:.2f} s saved an epoch ({surely:.2f} s beyond the epochs' spread), "
        f"{saved / epoch:.0%} of an epoch of {epoch:.2f} s, at the same samples/s "
        f"({c.describe()})"
    )


def _starts(p: Point) -> tuple[float, float, float] | None:
    """Later epochs' starts: the median, less and plus their median absolute deviation
    (unlike the extremes, it does not widen as more epochs are read)."""
    m = p.figures.epoch_start_s
    if m is None or m.value is None:
        return None
    mad = statistics.median(abs(v - m.value) for v in m.values or (m.value,))
    return m.value, m.value - mad, m.value + mad
