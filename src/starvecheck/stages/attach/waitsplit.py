"""The training loop's wait for data split over the stages of loading (attach; the
stages are core/schema/loading.py's, the words watch splits its own wait in), from the
samples alone:

  - where the loop's thread does the work itself, its sample says the stage: its own
    loading at num_workers=0 (read, transform, collate, pin), taking a batch over from a
    worker (handover), a pass's workers made or ended (startup);
  - where it waits on the queue for the pin-memory thread (pin_memory=True), that
    thread's sample at the same tick says whether it was pinning (pin) or receiving the
    batch (handover): one py-spy samples every thread of a process at once, so the two
    threads' samples line up one for one (only where both were sampled throughout);
  - where it waits on the queue for a worker, what the workers were doing. Their samples
    do not line up with the loop's: each worker has a py-spy of its own, started apart,
    and py-spy's speedscope output carries no times. So the assumption, labelled on
    each share it enters (`from_workers`): while the loop waits for a worker, the
    workers' work is in the proportions of their busy samples over the whole window
    (their read, transform, collate, startup; their idle samples left out). It holds
    where the workers are the bottleneck (busy all along, the loop waiting on them);
    where they are often idle, work hidden behind the step weighs in it too. Where every
    worker sample was idle, the batch was on its way: handover. Where no worker was
    sampled, that part of the wait is not split (the stages add up to less than it).

Each stage's share is of the loop's samples waiting for data (`exposed_share`,
labelled `load_stage`), with its 95% interval counted from the samples in the order
taken (core/intervals.worth; a sample waiting on a worker counts as the workers' share
of the stage), and, where the workers' share entered, the widest of the intervals at
the two ends of that share's own interval (from the workers' samples, each worker's in
its order).
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.intervals import Worth, interval, worth
from starvecheck.core.schema.attach import Interval, Loading, WaitPart
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import LoadStage

# What a sample of loading is doing (a Loading kind) as a stage of loading; IDLE is no
# stage: waiting for another thread or process.
STAGE_OF = {
    Loading.READ: LoadStage.READ,
    Loading.DECODE: LoadStage.TRANSFORM,
    Loading.TOKENIZE: LoadStage.TRANSFORM,
    Loading.OTHER: LoadStage.TRANSFORM,  # the dataset's own code, named for no read
    Loading.COLLATE: LoadStage.COLLATE,
    Loading.HANDOVER: LoadStage.HANDOVER,
    Loading.STARTUP: LoadStage.STARTUP,
    Loading.PIN: LoadStage.PIN,
}
QUEUED = None  # a wait sample on a worker: the workers' stages stand for it


def stages_of(
    waits: Sequence[Loading], pinning: Sequence[Loading | None] | None
) -> list[LoadStage | None]:
    """Each wait sample's stage where the loop's thread or the pin-memory thread at the
    same tick (`pinning`, one for each wait sample, where lined up) says it; QUEUED
    where it waits for a worker."""
    out: list[LoadStage | None] = []
    for i, kind in enumerate(waits):
        stage = STAGE_OF.get(kind)
        if stage is None and pinning is not None and i < len(pinning):
            helper = pinning[i]
            if helper in (Loading.PIN, Loading.HANDOVER):
                stage = STAGE_OF[helper]
        out.append(stage)
    return out


def split(
    waits: Sequence[Loading],
    pinning: Sequence[Loading | None] | None,
    workers: Sequence[Sequence[Loading]],
    ordered: tuple[bool, bool],
) -> list[WaitPart]:
    """The loop's wait by stage: `waits`, the loop thread's samples waiting for data;
    `pinning`, the pin-memory thread's sample at each of them where lined up; `workers`,
    each sampled worker's samples; `ordered`: whether the loop's, and the workers',
    are in the order taken. Each stage's part as the module says."""
    n = len(waits)
    if not n:
        return []
    stages = stages_of(waits, pinning)
    queued = sum(1 for s in stages if s is QUEUED)
    busy = [[STAGE_OF[k] for k in seq if k in STAGE_OF] for seq in workers]
    spread = sum(len(b) for b in busy)
    sampled = any(workers)
    mix: dict[LoadStage, tuple[float, float, float]] = {}
    if queued and spread:
        mix = {s: _share_of(busy, s, ordered[1]) for s in sorted({x for b in busy for x in b})}
    elif queued and sampled:  # every worker sample idle: the batch on its way
        mix = {LoadStage.HANDOVER: (1.0, 1.0, 1.0)}
    out: list[WaitPart] = []
    for stage in sorted({s for s in stages if s is not QUEUED} | set(mix)):
        ends = mix.get(stage, (0.0, 0.0, 0.0))
        got = [_interval(stages, stage, m, ordered[0]) for m in ends]
        share, eff, runs = got[0][0], got[0][3], got[0][4]
        low, high = min(g[1] for g in got), max(g[2] for g in got)
        ci = Interval(round(low, 4), round(high, 4), n, round(eff, 1), runs)
        out.append(WaitPart(stage, Figure.single(round(share, 4)), ci, stage in mix))
    return out


def _share_of(
    busy: Sequence[Sequence[LoadStage]], stage: LoadStage, ordered: bool
) -> tuple[float, float, float]:
    """(share, low, high): the stage's share of the workers' busy samples, its interval
    from each worker's samples in order (pooled), or Wilson's where unordered."""
    total = sum(len(b) for b in busy)
    hits = sum(1 for b in busy for x in b if x == stage)
    w = worth(*[[x == stage for x in b] for b in busy]) if ordered else _plain(total)
    low, high = interval(hits, total, w)
    return hits / total, low, high


def _interval(
    stages: Sequence[LoadStage | None], stage: LoadStage, m: float, ordered: bool
) -> tuple[float, float, float, float, int]:
    """(share, low, high, worth, runs) of `stage` in the wait samples, a queued sample
    counted as `m` of it."""
    x = [1.0 if s == stage else (m if s is QUEUED else 0.0) for s in stages]
    n = len(x)
    w = worth(x) if ordered else _plain(n)
    low, high = interval(sum(x), n, w)
    return sum(x) / n, low, high, w.effective, w.runs


def _plain(n: int) -> Worth:
    """Samples with no order: each counted as a draw (Wilson's)."""
    return Worth(n, float(n), n)
