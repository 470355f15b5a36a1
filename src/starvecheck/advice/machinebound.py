"""What bounds the worker model's predictions on a live loop (docs/architecture.md,
principle 9): the other processes' CPUs over the seconds read, with their spread, and
when the machine is too busy, or the bound too wide, for the model to give a figure.
Pure functions of the figures measured (advice/loopmodel.py calls them); where they
answer with a reason, no figure is given and the measured path is named instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# A loop with workers changes its count only for a predicted gain of this or more.
MIN_GAIN = 1.05
# Other processes' CPUs each second: the bound reads the high side of their spread
# (this quantile), the width the low side against it.
OTHERS_LOW_Q, OTHERS_HIGH_Q = 0.1, 0.9
# Other processes keeping fewer CPUs busy than this (a shell, a monitor) leave the
# machine quiet: the model's answer stands however few CPUs are left.
OTHERS_LEAST = 0.25
# Fewer CPUs than this left for workers, with others busy: too busy for the model.
FREE_LEAST = 0.25
# A load average past this many times the machine's CPUs: too busy for the model.
LOAD_PER_CPU = 2.0
# The prediction at the low side of the others' spread over that at the high side past
# this: the bound is too wide to give a figure.
WIDE_RATIO = 1.25
# At num_workers=0, the training process's other threads spending more CPU than this
# share of the loading thread's on a batch: what a worker's one thread would spend is
# uncertain between the two.
POOL_SHARE = 0.1
# What measures where the model cannot tell.
MEASURED_PATH = "`starvecheck loader --factory FILE.py:FUNC`"


def quantile(values: Sequence[float], q: float) -> float:
    v = sorted(values)
    at = q * (len(v) - 1)
    lo = math.floor(at)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (at - lo)


def spread(each: Sequence[float]) -> tuple[float, float, float] | None:
    """(low, median, high) of the other processes' CPUs each second; None: not measured."""
    values = [max(0.0, float(x)) for x in each if x is not None and math.isfinite(x)]
    if not values:
        return None
    return quantile(values, OTHERS_LOW_Q), quantile(values, 0.5), quantile(values, OTHERS_HIGH_Q)


def too_busy(
    load: float | None, machine: float, effective: float, others: float, own: float, free: float
) -> str | None:
    """Why the machine is too busy for the model to tell, or None: its load average
    past twice its CPUs, or other processes (`others`: their median) and the training
    process's own step (`own` CPUs) leaving (almost) no CPU for workers (`free`)."""
    if load is not None and load > LOAD_PER_CPU * machine:
        return (
            f"the machine's load average is {load:.1f} on {machine:g} CPU(s), "
            f"past {LOAD_PER_CPU:g}x its CPUs"
        )
    if others >= OTHERS_LEAST and free < FREE_LEAST:
        return (
            f"other processes kept {others:.1f} CPU(s) busy (median each second) and the "
            f"training process {own:.1f} in its step, of {effective:g} effective: "
            f"{max(0.0, free):.1f} left for workers"
        )
    return None


def too_wide(
    changes: bool, changes_bound: bool, most: float, least: float, low: float, high: float
) -> str | None:
    """Why the prediction is too uncertain to give, or None: the count changes with
    the others at the low side of their spread (`changes`, `most`x), and at its high
    side (`changes_bound`, `least`x) the gain falls below the bar, or the two differ
    by more than WIDE_RATIO."""
    if not changes or high - low < OTHERS_LEAST:  # no spread to be wide: the bound stands
        return None
    if changes_bound and least >= MIN_GAIN and most <= WIDE_RATIO * least:
        return None
    return (
        f"the bound is too wide: other processes' CPU use went from {low:.1f} to {high:.1f} "
        f"CPU(s) over the seconds read, and the model predicts {most:.2f}x at the low side "
        f"but {least:.2f}x at the high side"
    )


def pool_wide(thread: float, process: float, least: float, most: float) -> str | None:
    """Why a num_workers=0 loop's forecast is too uncertain to give, or None: the
    training process's threads together spent `process` ms of CPU on a batch and the
    loading thread `thread`; the rest is torch's intra-op pool, either parallel work (a
    worker's one thread does it too: `least`x) or spinning while it waits for work (a
    worker does none of it: `most`x). Wide where the two part by more than WIDE_RATIO
    (else the forecast at `least`, the fewer workers, stands)."""
    if process <= (1 + POOL_SHARE) * thread or most <= WIDE_RATIO * least:
        return None
    return (
        f"the bound is too wide: beside the loading thread's {thread:.1f} ms of CPU a batch, "
        f"the training process's other threads (torch's intra-op pool) took "
        f"{process - thread:.1f} ms, either work a worker's one thread would do too or "
        f"spinning while they wait for work, which it would not; the model predicts "
        f"{least:.2f}x if it is all work but {most:.2f}x if none is"
    )
