"""`watch` under torch.distributed: each rank times its own loop, rank 0 reports them all.

The figures travel through the process group's key-value store (the TCPStore that
torchrun or `init_process_group` made): each rank *writes* its own under a key of
its own, which never waits for anyone, and rank 0 reads them. A collective
(`gather_object`) would block a rank that has stopped iterating (a `break`, an uneven
last batch) until every other rank called it too; the store never does, and needs no
CUDA tensor on an NCCL group. Rank 0 waits a bounded time for ranks that have not
reached the same point (WAIT_EVERY_S, WAIT_END_S) and says whose figures are older.

Per rank and step: the data wait, the compute, and the time the rank waited for the
others. With `barrier=True` that last is measured at a `dist.barrier()` once each
batch is in hand (`rank_wait_ms`). Without it, it is estimated: in a synchronous job
every rank's step ends together, so a rank's compute above the fastest rank's in the
same step is time spent waiting inside the step's collectives (DDP's gradient
all-reduce) for a slower rank. Either way a rank's *work* is its step less that wait;
whether a rank is a straggler is judged in advice/stragglers.py (the rule
profile --trace and doctor use), not here.

This module reads figures (loop/times.py: `LoopTimes`, `RankTimes`, and their
encoding), never the timer that takes them.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.steps import Step, StepFigure, StepFigures
from starvecheck.loop.samples import shared
from starvecheck.loop.times import LoopTimes, RankTimes

KEY = "starvecheck.watch"
WAIT_EVERY_S = 5.0  # an `every` report: how long rank 0 waits for the others' same step
WAIT_END_S = 60.0  # the end of a pass: how long rank 0 waits for the others' ends
POLL_S = 0.02
# Each rank sends at most its last WINDOW steps: what is sent (and rank 0 reads, for
# every rank) stays bounded however long the job runs.
WINDOW = 4096
# The figures the per-rank table shows, relabelled with their rank.
PER_RANK = (
    Step.STEPS,
    Step.STEP_MS,
    Step.DATA_WAIT_MS,
    Step.COMPUTE_MS,
    Step.DATA_WAIT_SHARE,
    Step.FIRST_STEP_MS,
)

# Every rank makes its watches in the same order, so the n-th watch of one rank is
# the n-th of the others: its key in the store.
_numbers = itertools.count()


@dataclass
class Gathered:
    """Rank 0's view of every rank: figures by rank (its own included), and the
    ranks whose figures did not reach the point rank 0 was at, with why."""

    payloads: dict[int, RankTimes]
    world: int
    late: dict[int, str] = field(default_factory=dict)
    unreachable: str | None = None  # why the store could not be read at all


@dataclass
class Peers:
    rank: int
    world: int
    store: Any  # torch.distributed.Store, or None where it could not be had
    key: str
    why: str | None = None  # why there is no store

    @classmethod
    def find(cls) -> Peers | None:
        """This process's rank among two or more, when the loop's process has an
        initialised torch.distributed default group; never imports torch itself."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        world = dist.get_world_size()
        if world < 2:
            return None
        store, why = None, None
        try:
            # Private, but there since torch 1.x: the store the default group was made
            # with. Reading it needs no collective.
            store = dist.distributed_c10d._get_default_store()
        except Exception as e:
            why = f"the process group's store could not be had ({type(e).__name__}: {e})"
        return cls(dist.get_rank(), world, store, f"{KEY}/{next(_numbers)}", why)

    def _key(self, rank: int) -> str:
        return f"{self.key}/{rank}"

    def post(self, times: LoopTimes, *, final: bool) -> Gathered | None:
        """This rank's figures to rank 0: a rank above 0 writes them to the store (and
        gets None); rank 0 gathers every rank's, its own included. `final`: the pass
        has ended (else an `every` report)."""
        mine = times.encode(rank=self.rank, final=final, window=WINDOW)
        if self.rank != 0:
            self.publish(mine)
            return None
        return self.collect(RankTimes.decode(mine))

    def publish(self, data: bytes) -> None:
        if self.store is None:
            return
        try:
            self.store.set(self._key(self.rank), data)
        except Exception as e:  # the store went away (rank 0 gone): nothing to report to
            self.store, self.why = None, f"the store could not be written ({e})"

    def collect(self, own: RankTimes) -> Gathered:
        """Rank 0, with its own figures: every rank's latest. Waits up to WAIT_END_S (a
        pass's end) or WAIT_EVERY_S (an `every` report) for ranks behind this one."""
        got: dict[int, RankTimes] = {self.rank: own}
        if self.store is None:
            return Gathered(got, self.world, unreachable=self.why or "no store")
        deadline = clocks.monotonic() + (WAIT_END_S if own.final else WAIT_EVERY_S)
        want = set(range(self.world)) - {self.rank}
        try:
            while True:
                for r in sorted(want):
                    if self.store.check([self._key(r)]):
                        got[r] = RankTimes.decode(self.store.get(self._key(r)))
                ready = {r for r in want if r in got and _caught_up(got[r], own)}
                want -= ready
                if not want or clocks.monotonic() >= deadline:
                    break
                clocks.sleep(POLL_S)
        except Exception as e:
            return Gathered(got, self.world, unreachable=f"the store could not be read ({e})")
        if own.final:  # read for good: the store (rank 0's memory, or the agent's) lets go
            for r in set(got) - want - {self.rank}:
                with contextlib.suppress(Exception):
                    self.store.delete_key(self._key(r))
        late = {}
        for r in sorted(want):
            if r not in got:
                late[r] = "sent no figures"
            else:
                p = got[r]
                late[r] = (
                    f"sent figures up to step {p.steps} of pass {p.passes} "
                    f"(rank {self.rank}: step {own.steps} of pass {own.passes})"
                )
        return Gathered(got, self.world, late)


def _caught_up(p: RankTimes, own: RankTimes) -> bool:
    """Whether a rank's figures reach the point rank 0 is at: a later pass, or this
    pass's end, or (an `every` report) at least as many steps."""
    if p.passes != own.passes:
        return p.passes > own.passes
    return p.final or (not own.final and p.steps >= own.steps)


def name(rank: int) -> str:
    return f"rank {rank}"


def common_steps(loops: Mapping[int, LoopTimes]) -> range:
    """The steps (counted from each rank's first, 0) that every rank sent, the first
    (a warm-up) left out."""
    lo = max(1, *(w.offset for w in loops.values()))
    hi = min(w.steps for w in loops.values())
    return range(lo, max(lo, hi))


def waits_for_others(
    loops: Mapping[int, LoopTimes], steps: range
) -> tuple[dict[int, list[float]], str]:
    """Per rank, the seconds it waited for the others in each of `steps`, and where
    they come from: 'barrier' (timed) or 'estimated' (compute above the fastest
    rank's in the same step)."""
    if all(len(w.rank_waits) == len(w.waits) > 0 for w in loops.values()):
        timed = {r: [w.rank_waits[i - w.offset] for i in steps] for r, w in loops.items()}
        return timed, "barrier"
    fastest = [min(w.computes[i - w.offset] for w in loops.values()) for i in steps]
    return {
        r: [w.computes[i - w.offset] - f for i, f in zip(steps, fastest, strict=True)]
        for r, w in loops.items()
    }, "estimated"


def combine(own: LoopTimes, rank: int, g: Gathered) -> StageResult:
    """Rank 0's result (`own`: its figures, `rank`: its rank): the headline rank's
    breakdown (the rank that waits most for data), labelled with quantities alone as a
    single loop's; each rank's figures labelled with its `rank`; `work_ms` and
    `rank_wait_ms` per common step."""
    loops = {r: p.times for r, p in g.payloads.items()}
    caveats = [*own.caveats(), *_gathering(g)]
    params = own.parameters() | {"world_size": g.world}
    if len(loops) < 2:
        return StageResult(
            "watch", parameters=params, metrics=tuple(own.metrics()), caveats=tuple(caveats)
        )
    figures_by = {r: w.figures() for r, w in loops.items()}
    shares = {r: head.value_of(Step.DATA_WAIT_SHARE) for r, (head, _, _) in figures_by.items()}
    headline = max(loops, key=lambda r: (shares[r] or 0.0, -r))
    out: list[StepFigure] = [
        replace(f, rank=name(r))
        for r in sorted(loops)
        for f in (*figures_by[r][0], *figures_by[r][2])
        if f.quantity in PER_RANK
    ]
    common = common_steps(loops)
    source = None
    if common:
        source = _work(loops, common, out)
    caveats += _comparing(loops, common, source)
    params |= {
        "headline_rank": name(headline),
        "rank_wait_source": source or "none",
        "common_steps": len(common),
        "ranks": [_row(g.payloads[r], StepFigures(tuple(out))) for r in sorted(loops)],
    }
    for key in ("num_workers", "dataloader", "effective_cpus", "sync", *SAMPLER):
        params[key] = g.payloads[headline].params.get(key, params.get(key))
    params |= _same_samples(loops)
    caveats += _shared_host(g.payloads, headline, params)
    if headline != rank:
        caveats = [c for c in caveats if c.id != "watch.warmup-left-out"] + list(
            loops[headline].caveats()
        )
    head, split, tail = figures_by[headline]
    metrics = (*head.to_metrics(), *split.to_metrics(), *tail.to_metrics())
    metrics += StepFigures(tuple(out)).to_metrics()
    return StageResult("watch", parameters=params, metrics=metrics, caveats=tuple(_unique(caveats)))


# The sampler's figures of the headline rank, reported as the loop's.
SAMPLER = ("sampler", "sampler_shuffle", "sampler_epochs", "same_order_passes")


def _same_samples(loops: Mapping[int, LoopTimes]) -> dict[str, Any]:
    """The ranks' first samples of the latest pass they all digested, compared: the
    share every rank had (1.0: every rank trains on the same batches)."""
    passes = set.intersection(*(set(p for p, d in w.digests.items() if d) for w in loops.values()))
    if not passes:
        return {}
    latest = max(passes)
    got = shared({r: w.digests[latest] for r, w in loops.items()})
    if got is None:
        return {}
    share, compared = got
    return {"ranks_same_share": round(share, 4), "ranks_samples_compared": compared,
            "ranks_compared_pass": latest}  # fmt: skip


def _gathering(g: Gathered) -> list[Caveat]:
    """What rank 0 could not gather: the store, or a rank that was late."""
    caveats = []
    if g.unreachable:
        caveats.append(
            Caveat(
                "watch.ranks-unreachable",
                f"only this rank's figures: {g.unreachable}",
            )
        )
    for r, why in g.late.items():
        caveats.append(
            Caveat(
                "watch.rank-late",
                f"{name(r)} {why} when rank 0 reported; its figures are those it had sent",
            )
        )
    return caveats


def _work(loops: Mapping[int, LoopTimes], common: range, out: list[StepFigure]) -> str:
    """Each rank's wait for the others and its work (the step less that wait) over
    the common steps, appended to `out`; where the wait comes from."""
    rank_waits, source = waits_for_others(loops, common)
    for r in sorted(loops):
        w, where = loops[r], name(r)
        waited = rank_waits[r]
        inside = waited if source == "estimated" else [0.0] * len(common)  # in compute
        work = [
            w.waits[i - w.offset] + w.computes[i - w.offset] - x
            for i, x in zip(common, inside, strict=True)
        ]
        out.append(_ms(Step.RANK_WAIT_MS, waited, where))
        out.append(_ms(Step.WORK_MS, work, where))
    return source


def _comparing(loops: Mapping[int, LoopTimes], common: range, source: str | None) -> list[Caveat]:
    """How the ranks' figures were compared: over the steps they all have, over the
    last steps each sent, with the wait for the others estimated."""
    caveats = []
    steps = {r: w.steps for r, w in loops.items()}
    if len(set(steps.values())) > 1:
        counts = ", ".join(f"{name(r)} {s}" for r, s in sorted(steps.items()))
        caveats.append(
            Caveat(
                "watch.ranks-steps-differ",
                f"the ranks completed different numbers of steps ({counts}): ranks are "
                f"compared step by step over the {len(common)} steps every rank has",
            )
        )
    if any(w.offset for w in loops.values()):
        caveats.append(
            Caveat(
                "watch.ranks-window",
                f"each rank sends its last {WINDOW:,} steps: every rank's figures are over "
                "those (the headline rank's too)",
            )
        )
    if source == "estimated":
        caveats.append(
            Caveat(
                "watch.rank-wait-estimated",
                "the time each rank waits for the others is estimated: its compute above "
                "the fastest rank's in the same step (ranks doing alike work in a "
                "synchronous job); watch(..., barrier=True) measures it at a barrier",
            )
        )
    return caveats


def _row(p: RankTimes, metrics: StepFigures) -> dict[str, Any]:
    """A rank's row in the JSON's `ranks`: who, how far, its means."""
    return {
        "rank": name(p.rank),
        "host": p.host,
        "steps": p.steps,
        "pass": p.passes,
        "final": p.final,
        **_rank_summary(metrics, name(p.rank)),
    }


def _shared_host(
    payloads: Mapping[int, RankTimes], headline: int, params: dict[str, Any]
) -> list[Caveat]:
    """Ranks on one host share its CPUs: the headline rank's workers get its share
    (`params` changed in place)."""
    host = payloads[headline].host
    beside = [r for r, p in payloads.items() if p.host == host]
    cpus = params.get("effective_cpus")
    if len(beside) < 2 or not isinstance(cpus, int | float):
        return []
    params["effective_cpus"] = cpus / len(beside)
    params["ranks_on_host"] = len(beside)
    return [
        Caveat(
            "watch.ranks-share-host",
            f"{len(beside)} ranks run on {host or 'one host'} and share its "
            f"{cpus:g} CPUs: {name(headline)}'s DataLoader workers are counted with "
            f"{cpus / len(beside):.2g} of them",
        )
    ]


def _rank_summary(figures: StepFigures, where: str) -> dict[str, float | None]:
    """A rank's means in ms (and data-wait share), for the JSON's `ranks`."""
    out: dict[str, float | None] = {}
    for f in figures:
        if f.rank != where or f.quantity is Step.STEPS:
            continue
        x = f.figure
        if x.values:
            out[f.quantity.value] = round(sum(x.values) / len(x.values), 4)
        else:
            out[f.quantity.value] = None if x.value is None else round(x.value, 4)
    return out


def _unique(caveats: Sequence[Caveat]) -> list[Caveat]:
    seen: set[str] = set()
    out = []
    for c in caveats:
        if c.text not in seen:
            seen.add(c.text)
            out.append(c)
    return out


def _ms(quantity: Step, seconds: Sequence[float], rank: str) -> StepFigure:
    return StepFigure(quantity, Figure.repeated([s * 1e3 for s in seconds]), "ms", rank=rank)
