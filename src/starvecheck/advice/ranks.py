"""Stragglers among ranks, for `profile --trace` of a multi-rank job and for `watch`
under torch.distributed: doctor's rule (a rank whose rate, 1 / its work, is under 80%
of the median rank's) on each rank's work, the step less its wait for the others. One
rank throughout is `profile.straggler`; a different rank in turn,
`profile.straggler-rotating`. Reads figures labelled `rank` (model.per_rank).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from starvecheck.advice.nodes import STRAGGLER_SHARE, stragglers
from starvecheck.advice.profile import few_steps
from starvecheck.model import (
    Finding,
    Gain,
    GainKind,
    Metric,
    Severity,
    per_rank,
    slowest_per_step,
)

# How the time a rank waits for the others was had: (what work is the step less of,
# where the others wait). A trace times its collectives; watch times a barrier or
# estimates the wait inside the step's collectives.
COLLECTIVES = ("its time in collectives", "in collectives")
WAITING = {
    "barrier": ("its wait at the barrier after each batch", "at the barrier"),
    "estimated": (
        "its estimated wait for the others (its compute above the fastest rank's)",
        "in the step's collectives (estimated: watch(..., barrier=True) measures it)",
    ),
}


def straggler(metrics: Sequence[Metric], findings: Sequence[Finding]) -> dict[str, Any]:
    """The straggler verdict as data, for a report's JSON: `pattern` is 'fixed' (one
    rank, named), 'rotating' (a different rank in turn) or 'none'; `slowest_in` how
    many common steps each rank had the most work in. From the same findings people
    read, so the two never disagree."""
    per_step = slowest_per_step(metrics)
    turns = Counter(k for k, _, _ in per_step)
    out: dict[str, Any] = {
        "pattern": "none",
        "rank": None,
        "lost_share": None,
        "slowest_in": {k: turns.get(k, 0) for k in per_rank(metrics, "work_ms")},
        "steps_compared": len(per_step),
    }
    for f in findings:
        if f.id == "profile.straggler":
            return out | {
                "pattern": "fixed",
                "rank": f.fix.get("rank"),
                "cause": f.fix.get("cause"),
                "lost_share": f.gain.value if f.gain else None,
            }
        if f.id == "profile.straggler-rotating":
            out |= {"pattern": "rotating", "lost_share": f.gain.value if f.gain else None}
    return out


def ranks(metrics: Sequence[Metric], waiting: tuple[str, str] | None = None) -> list[Finding]:
    """Stragglers among the ranks of a multi-rank trace or loop, by doctor's rule (a
    rank whose rate is below 80% of the median rank's): one rank throughout, or a
    different rank from step to step. `waiting` says how the time a rank waits for
    the others was had (COLLECTIVES by default)."""
    less, where = waiting or COLLECTIVES
    per_step = slowest_per_step(metrics)
    if not per_step:
        return []
    values = {k: x.values for k, x in per_rank(metrics, "work_ms").items()}
    work = {k: sum(v) / len(v) for k, v in values.items()}
    steps = {k: _avg(x) for k, x in per_rank(metrics, "step_ms").items()}
    waits = {k: _avg(x) for k, x in per_rank(metrics, "data_wait_ms").items()}
    median, slow = stragglers({k: 1.0 / w for k, w in work.items() if w > 0}, STRAGGLER_SHARE)
    if median is None:
        return []
    n = len(per_step)
    # Each straggler against the ranks that keep up (with two ranks the median of all
    # would halve what it costs them).
    fast = [k for k in work if k not in slow] or list(work)
    found = [_straggler(k, work, values, steps, waits, n, fast, less, where) for k in slow]
    if slow:
        return found
    over = [(k, w, med) for k, w, med in per_step if med > 0 and w > med / STRAGGLER_SHARE]
    who = Counter(k for k, _, _ in over)
    if len(over) < 2 or len(over) < 0.25 * n or len(who) < 2:
        return found
    step = statistics.median(v for v in steps.values() if v is not None) if steps else None
    lost = sum(w - med for _, w, med in over) / n
    turns = ", ".join(f"{k} ({c} step{'s' if c > 1 else ''})" for k, c in who.most_common())
    sev, few = few_steps(n, Severity.WARNING, "on every rank")
    return [
        Finding(
            "profile.straggler-rotating",
            sev,
            f"A different rank holds up the step in {len(over)} of {n} steps",
            evidence=(
                f"in {len(over)} of {n} steps one rank's work (the step less {less}) "
                f"runs over {1 / STRAGGLER_SHARE:.2f}x the median rank's, a different rank "
                f"in turn: {turns}; the others wait {where}, a mean {lost:,.1f} ms a step"
                + few
                + "."
            ),
            recommendation=(
                "No one node is slow: every rank's loader is marginal, and whichever is late "
                "in a step holds up all of them. Give each rank's loader headroom, so a slow "
                "batch is hidden: more `prefetch_factor` (and `num_workers`) on every rank, "
                "steadier sample cost (bucket by length, pre-tokenize), and look for "
                "stragglers' causes that come and go (GC pauses, checkpoint writes, noisy "
                "neighbours on shared storage). `starvecheck doctor` under torchrun measures "
                "every node's data pipeline."
            ),
            gain=Gain(
                GainKind.STEP_SHARE,
                round(lost / step, 4) if step else None,
                "the mean time the others wait for the slowest rank, over the step",
            ),
            stage="profile",
        )
    ]


def _others(ranks: Sequence[str]) -> str:
    return f"{ranks[0]}'s" if len(ranks) == 1 else f"the median of the other {len(ranks)} ranks'"


def _avg(x: Metric) -> float | None:
    if x.values:
        return sum(x.values) / len(x.values)
    return x.value


def paced(values: Sequence[float], ranks: int) -> float:
    """The mean step of `ranks` ranks whose work per step is drawn from `values`: a
    synchronous step lasts as long as its slowest rank, so the expected maximum of
    `ranks` draws (with replacement, from the sorted values)."""
    v = sorted(values)
    m = len(v)
    return sum(x * (((i + 1) / m) ** ranks - (i / m) ** ranks) for i, x in enumerate(v))


def _straggler(
    rank: str,
    work: Mapping[str, float],
    values: Mapping[str, Sequence[float]],
    steps: Mapping[str, float | None],
    waits: Mapping[str, float | None],
    n: int,
    fast: Sequence[str],
    less: str,
    where: str,
) -> Finding:
    """`fast`: the ranks it is compared with (those that keep up)."""
    others = [k for k in fast if k != rank] or [k for k in work if k != rank]
    med = statistics.median(work[k] for k in others)
    extra = work[rank] - med
    # What the job loses: its step with this rank at the others' pace is, each step,
    # the slowest of all the ranks alike; this rank's work above that.
    lost = max(0.0, work[rank] - paced([v for k in others for v in values[k]], len(work)))
    wait = waits.get(rank)
    known = [waits[k] for k in others if waits.get(k) is not None]
    wait_med = statistics.median(known) if known else None
    data = wait is not None and wait_med is not None and wait - wait_med >= extra / 2
    step = steps.get(rank) or work[rank]
    evidence = (
        f"{rank}'s work (the step less {less}) is a mean {work[rank]:,.1f} ms against "
        f"{_others(others)} {med:,.1f} ms: its rate is under {STRAGGLER_SHARE:.0%} of the "
        f"median rank's, and the other ranks wait for it {where}"
    )
    if wait is not None and wait_med is not None:
        evidence += f"; its data wait is {wait:,.1f} ms a step against {wait_med:,.1f} ms"
    sev, few = few_steps(
        n, Severity.CRITICAL if lost / step >= 0.5 else Severity.WARNING, "on every rank"
    )
    if data:
        what = (
            f"{rank} waits for data longer than the others: its node's input pipeline is the "
            "slow link. Run `starvecheck doctor` on that node (storage, loader, CPU) and "
            "compare it with a fast one; give that rank's DataLoader more workers and "
            "prefetch, or move its data to storage as fast as the others'."
        )
    else:
        what = (
            f"{rank} computes longer than the others with no more data wait: look at that "
            "node's GPU (clocks, thermals: `nvidia-smi -q -d PERFORMANCE`), its host (CPU "
            "contention, NUMA), and at whether its share of the batch is larger (uneven "
            "sequence lengths: bucket by length)."
        )
    return Finding(
        "profile.straggler",
        sev,
        f"{rank} is a straggler: every step waits {lost:,.1f} ms for it",
        evidence=evidence + few + ".",
        recommendation=what,
        gain=Gain(
            GainKind.STEP_SHARE,
            round(lost / step, 4) if step else None,
            f"the straggler at the others' pace: each step then lasts as long as the slowest "
            f"of {len(work)} ranks like them; the time it saves, over the step",
        ),
        stage="profile",
        fix={"rank": rank, "cause": "data wait" if data else "compute"},
    )
