"""Stragglers: the ranks of a data-parallel job that the others wait for.

In synchronous data-parallel training every step waits for the slowest rank, so one
slow rank slows the whole job. One rule, two kinds of evidence:

- **ranks of one job** (`profile --trace` of a multi-rank job, `watch` under
  torch.distributed): each rank's work, the step less its wait for the others, step
  by step. A rank whose rate (1 / its work) is under 80% of the median rank's
  throughout is `profile.straggler`; a different rank in turn,
  `profile.straggler-rotating`. Reads each rank's figures (StepFigures.per_rank).
  `summary` states the verdict as data for the JSON, in the same shape for both.
- **nodes of doctor** (doctor under torchrun, starvecheck.cli.ranks): each node's
  data-pipeline capacity (the lower of storage and loader). A node under 80% of the
  median is `doctor.straggler`. Pure functions of the ranks' reports (as
  `Report.to_dict()` gives them).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar, cast

from starvecheck.advice.profile import few_steps
from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult
from starvecheck.core.report import Link
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.nodes import Node
from starvecheck.core.schema.steps import Parameters as StepParameters
from starvecheck.core.schema.steps import Step, StepFigures, Straggler

K = TypeVar("K", int, str)

# The rule: a rank (or node) whose rate is under this share of the median's.
STRAGGLER_SHARE = 0.8


def below_median(
    values: Mapping[K, float | None], share: float = STRAGGLER_SHARE
) -> tuple[float | None, list[K]]:
    """(median of the measured values, the keys below `share` of it)."""
    known = {r: v for r, v in values.items() if v is not None}
    if len(known) < 2:
        return None, []
    median = statistics.median(known.values())
    return median, sorted(r for r, v in known.items() if v < share * median)


# Ranks of one job: profile --trace and watch.

# Their figures carry a `rank` label.


def slowest_per_step(figures: StepFigures) -> list[tuple[str, float, float]]:
    """Per step every rank has: (the rank with the most work, its work, the median
    rank's work), in ms. Work is the step less its GPU's time in collectives: in a
    synchronous job the fast ranks wait there for the slow one."""
    work = {k: x.values for k, x in figures.per_rank(Step.WORK_MS).items() if x.values}
    if len(work) < 2 or len({len(v) for v in work.values()}) != 1:
        return []
    out = []
    for i in range(len(next(iter(work.values())))):
        at = {k: v[i] for k, v in work.items()}
        slow = max(at, key=lambda k: at[k])
        out.append((slow, at[slow], statistics.median(at.values())))
    return out


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


def summary(figures: StepFigures, findings: Sequence[Finding]) -> Straggler:
    """The straggler verdict as data, for a report's JSON: `pattern` is 'fixed' (one
    rank, named), 'rotating' (a different rank in turn) or 'none'; `slowest_in` how
    many common steps each rank had the most work in. From the same findings people
    read, so the two never disagree."""
    per_step = slowest_per_step(figures)
    turns = Counter(k for k, _, _ in per_step)
    out = Straggler(
        slowest_in={k: turns.get(k, 0) for k in figures.per_rank(Step.WORK_MS)},
        steps_compared=len(per_step),
    )
    for f in findings:
        lost = f.gain.value if f.gain else None
        if f.id == catalogue.PROFILE_STRAGGLER:
            # Both are strings, as the finding writes them (below).
            rank, cause = cast(str | None, f.fix.get("rank")), cast(str | None, f.fix.get("cause"))
            return replace(out, pattern="fixed", rank=rank, cause=cause, lost_share=lost)
        if f.id == catalogue.PROFILE_STRAGGLER_ROTATING:
            out = replace(out, pattern="rotating", lost_share=lost)
    return out


def verdicts(
    stages: Mapping[str, StageResult], findings: Sequence[Finding]
) -> dict[str, Straggler]:
    """What judging adds to the judgement of a stage with several ranks (watch under
    torch.distributed, `profile --trace` of a multi-rank job): the straggler `summary`
    of its ranks, one shape for both (advice.judge attaches it)."""
    return {
        name: summary(r.records(StepFigures), findings)
        for name in ("trace", "watch")
        if (r := stages.get(name)) is not None and r.parameters.read(StepParameters).ranks
    }


def among_ranks(figures: StepFigures, waiting: tuple[str, str] | None = None) -> list[Finding]:
    """Stragglers among the ranks of a multi-rank trace or loop, by doctor's rule (a
    rank whose rate is below 80% of the median rank's): one rank throughout, or a
    different rank from step to step. `waiting` says how the time a rank waits for
    the others was had (COLLECTIVES by default)."""
    less, where = waiting or COLLECTIVES
    per_step = slowest_per_step(figures)
    if not per_step:
        return []
    values = {k: x.values for k, x in figures.per_rank(Step.WORK_MS).items()}
    work = {k: sum(v) / len(v) for k, v in values.items()}
    steps = {k: _avg(x) for k, x in figures.per_rank(Step.STEP_MS).items()}
    waits = {k: _avg(x) for k, x in figures.per_rank(Step.DATA_WAIT_MS).items()}
    median, slow = below_median({k: 1.0 / w for k, w in work.items() if w > 0})
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
            catalogue.PROFILE_STRAGGLER_ROTATING,
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
            stage="trace",
        )
    ]


def _others(ranks: Sequence[str]) -> str:
    return f"{ranks[0]}'s" if len(ranks) == 1 else f"the median of the other {len(ranks)} ranks'"


def _avg(x: Figure) -> float | None:
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
    known = [w for k in others if (w := waits.get(k)) is not None]
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
        catalogue.PROFILE_STRAGGLER,
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
        stage="trace",
        fix={"rank": rank, "cause": "data wait" if data else "compute"},
    )


# Nodes of doctor under torchrun.

PIPELINE_LINKS = ("storage", "loader")


def data_pipeline(capacities: Mapping[str, float | None]) -> float | None:
    """The lower of the storage and loader capacities that were measured."""
    known = [v for k, v in capacities.items() if k in PIPELINE_LINKS and v is not None]
    return min(known) if known else None


def node_rows(payloads: Sequence[Mapping[str, Any]]) -> list[Node]:
    """One row per rank, by rank: host, each link's capacity, the data pipeline."""
    out = []
    for p in payloads:
        who = Node.from_dict(p)  # the rank and the host it ran on
        if who is None:
            continue
        chain = [Link.from_dict(x) for x in p["report"].get("chain", [])]
        caps = {x.link: x.capacity for x in chain}
        # The node's own pipeline is compared: a loader at num_workers=0 counted alone,
        # not taking turns with the step (advice/capacity.loader), which would make
        # every node look alike.
        own = {x.link: x.parts.get("alone") or x.capacity for x in chain}
        out.append(
            replace(
                who, capacity_samples_per_s=caps, data_pipeline_samples_per_s=data_pipeline(own)
            )
        )
    return sorted(out, key=lambda n: n.rank)


def among_nodes(
    payloads: Sequence[Mapping[str, Any]], demand: float | None
) -> tuple[list[Node], list[Finding]]:
    """Rows with stragglers marked, and one doctor.straggler finding per straggler.

    Severity: critical when the straggler cannot feed its own GPU (below demand): in
    synchronous training every rank then waits for it, every step. Warning when it still
    keeps up: nothing is lost today, but it is the first node to starve with a faster
    GPU or model, and a node slower than its twins usually has a fault worth finding.
    """
    table = node_rows(payloads)
    median, slow = below_median({r.rank: r.data_pipeline_samples_per_s for r in table})
    findings = []
    for i, row in enumerate(table):
        if row.rank not in slow:
            continue
        row = table[i] = replace(row, straggler=True)
        value = row.data_pipeline_samples_per_s
        assert median is not None and value is not None
        starving = demand is not None and value < demand
        gain = None
        if starving and demand is not None:
            gain = Gain(
                GainKind.THROUGHPUT,
                round(min(median, demand) / value, 3),
                "the straggler raised to the median node (or the GPU's demand, if lower); "
                "synchronous training runs at the slowest rank's pace",
            )
        where = f"rank {row.rank}" + (f" on {row.host}" if row.host else "")
        findings.append(
            Finding(
                catalogue.DOCTOR_STRAGGLER,
                Severity.CRITICAL if starving else Severity.WARNING,
                f"{where.capitalize()} is a straggler: its data pipeline delivers "
                f"{value / median:.0%} of the median node's",
                evidence=(
                    f"data-pipeline capacity (lower of storage and loader) {value:,.0f} "
                    f"samples/s against a median of {median:,.0f} over {len(table)} ranks"
                    + (f"; the GPU consumes {demand:,.0f}" if demand is not None else "")
                    + ". In synchronous data-parallel training every rank waits for the "
                    "slowest at each step."
                ),
                recommendation=(
                    f"Compare {where}'s node with a healthy one: `starvecheck env` there "
                    "(CPU quota and throttling, other jobs on it, NUMA, /dev/shm), its "
                    "storage (`starvecheck io`: a slower disk or a remote mount), and its "
                    "loader settings. Fix the node or leave it out of the job."
                ),
                gain=gain,
                stage="doctor",
            )
        )
    return table, findings


def shared_hosts(table: Sequence[Node]) -> list[str]:
    """Caveats for ranks that measured one machine at the same time (torchrun with
    --nproc-per-node above 1): they shared its CPUs and storage while measuring."""
    by_host: dict[str, list[int]] = {}
    for row in table:
        by_host.setdefault(row.host, []).append(row.rank)
    return [
        f"ranks {', '.join(map(str, ranks))} measured {host or 'one host'} at the same time, "
        "sharing its CPUs and storage: each figure is what a rank gets beside the others"
        for host, ranks in by_host.items()
        if len(ranks) > 1
    ]
