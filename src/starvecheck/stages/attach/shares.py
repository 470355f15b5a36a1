"""A rank's sampled stacks read into shares (attach): its training loop's thread by what
it is doing (`Main`), its loading while it waits (`Loading`), its workers' and their
feeder threads'; each share with its 95% interval, counted from the samples in the
order py-spy took them where it gave it (core/intervals.effective_samples)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from starvecheck.core.intervals import effective_samples, wilson_effective
from starvecheck.core.metric import Metric
from starvecheck.core.schema.attach import (
    MAIN_LOADING_SHARE,
    MAIN_SHARE,
    WORKER_SHARE,
    Loading,
    Main,
    Rank,
)
from starvecheck.core.schema.common import SAMPLES
from starvecheck.core.schema.loading import EXPOSED_SHARE, LoadStage
from starvecheck.stages.attach import classify
from starvecheck.stages.attach.target import Process
from starvecheck.stages.attach.threads import loop_thread

if TYPE_CHECKING:
    from starvecheck.stages.attach.spy import Stacks


def _metric(name: str, value: float | None, unit: str, **labels: object) -> list[Metric]:
    if value is None:
        return []
    return [Metric.single(f"attach.{name}", round(float(value), 4), unit, labels)]


def _shares(
    counts: Counter[Main] | Counter[Loading],
    total: int,
    name: str,
    quantity: str,
    sequence: Sequence[object] | None = None,
    **lab: object,
) -> list[Metric]:
    """Each kind's share of `total` samples, with its 95% interval (labels `low95`,
    `high95`), the samples it was counted from (`samples`) and what they are worth as
    independent draws (`samples_effective`: from the kinds in the order sampled, where
    py-spy gave it, core/intervals.effective_samples; else all of them, Wilson's)."""
    out: list[Metric] = []
    for kind, n in sorted(counts.items()):
        eff = float(total)
        if sequence is not None and len(sequence) == total:
            eff = effective_samples([k == kind for k in sequence])
        low, high = wilson_effective(n, total, eff)
        ci = {
            "low95": round(low, 4),
            "high95": round(high, 4),
            "samples": total,
            "samples_effective": round(eff, 1),
        }
        out += _metric(f"{name}.{kind}", n / total, "share", quantity=quantity, kind=kind,
                       **ci, **lab)  # fmt: skip
    return out


def read_stacks(
    rank: Process, stacks: Stacks, src: classify.Source
) -> tuple[list[Metric], list[int], str, Rank]:
    """The shares of one rank's training loop, its loading, its workers and their
    feeder threads, from its samples; the workers seen; the loop's `other` frames;
    what the loop was read from (`thread`, `loop_found`, `data_path`)."""
    lab = {"rank": rank.rank, "pid": rank.pid}
    key, found = loop_thread(stacks, rank.pid)
    main = stacks.by_thread.get(key, []) if key is not None else []
    total = sum(n for _, n in main)
    out: list[Metric] = _metric("main.samples", total, "samples", quantity=SAMPLES, **lab)
    kinds: Counter[Main] = Counter()
    loading: Counter[Loading] = Counter()
    others: Counter[str] = Counter()
    fetches: Counter[str] = Counter()
    # a DataLoader seen anywhere in the rank's stacks (its workers, its pin-memory
    # thread), not only where the loop was caught waiting on it
    has_loader = any(
        classify.in_dataloader(f) for samples in stacks.by_thread.values() for f, _ in samples
    )
    loop = None if has_loader else classify.loop_frame(main)
    fetch = classify.fetches(main, loop) if loop is not None else set()
    kind_of: list[Main] = []  # each distinct stack's kind, in `main`'s order
    loading_of: list[Loading | None] = []
    for frames, n in main:
        kind = classify.main_kind(frames, src)
        loaded: Loading | None = None
        at = classify.callee_of(frames, loop) if fetch and loop is not None else None
        if at is not None and (frames[at].function, frames[at].file) in fetch:
            kind = Main.DATA  # the loop's own fetch, whatever torch it calls to stack a batch
            fetches[frames[at].short()] += n
            loaded = classify.loading_kind(frames[at:], src)
        elif kind == Main.DATA:
            loaded = classify.loading_kind(classify.loading_frames(frames), src)
        elif kind == Main.OTHER:
            others[classify.named(frames)] += n
        if loaded is not None:
            loading[loaded] += n
        kinds[kind] += n
        kind_of.append(kind)
        loading_of.append(loaded)
    if total and (has_loader or fetch):
        kinds[Main.DATA] += 0  # the wait's share stands with its interval, none sampled too
    if total:
        order = stacks.order.get(key) if key is not None else None
        seq = [kind_of[i] for i in order] if order else None
        loads = [loading_of[i] for i in order] if order else None
        out += _shares(kinds, total, "main", MAIN_SHARE, seq, **lab)
        out += _shares(loading, total, "main.loading", MAIN_LOADING_SHARE, loads, **lab)
    worker_kinds, workers, feeding, feeders = _workers(rank, stacks, src)
    wtotal = sum(worker_kinds.values())
    if wtotal:
        out += _shares(worker_kinds, wtotal, "workers", WORKER_SHARE, **lab)
    if total and kinds[Main.DATA]:
        order = stacks.order.get(key) if key is not None else None
        waits = [loading_of[i] for i in order if kind_of[i] == Main.DATA] if order else None
        out += stage_split(loading, worker_kinds, waits, lab)
    if feeders:
        busy = feeding / feeders
        out += _metric("workers.feeder_busy", busy, "share", quantity="feeder_busy_share", **lab)
    top = "; ".join(f"{what} {n / total:.0%}" for what, n in others.most_common(3)) if total else ""
    if has_loader:
        path: str | None = "DataLoader"
    else:
        path = ", ".join(f for f, _ in fetches.most_common(2)) or None
    thread = stacks.thread_names.get(key, "") if key is not None else None
    read = Rank(rank.pid, thread=thread, loop_found=found, data_path=path)
    return out, sorted(workers), top, read


def _workers(
    rank: Process, stacks: Stacks, src: classify.Source
) -> tuple[Counter[Loading], set[int], int, int]:
    """The workers' samples by what they did, the workers seen, and of their feeder
    threads' samples, the busy ones and all."""
    kinds: Counter[Loading] = Counter()
    workers: set[int] = set()
    feeding = feeders = 0
    for (pid, _tid), samples in stacks.by_thread.items():
        if pid == rank.pid:
            continue
        for frames, n in samples:
            after = classify.worker_frames(frames)
            if after is not None:
                workers.add(pid)
                kinds[classify.loading_kind(after, src)] += n
            busy = classify.feeder_busy(frames)
            if busy is not None:
                feeders += n
                feeding += n if busy else 0
    return kinds, workers, feeding, feeders


# What the loop thread was doing while it waited (a Loading kind) as a stage of loading
# (core/schema/loading.py); IDLE, waiting on the queue for a worker, is the workers'.
_STAGE_OF = {
    Loading.READ: LoadStage.READ,
    Loading.DECODE: LoadStage.TRANSFORM,
    Loading.TOKENIZE: LoadStage.TRANSFORM,
    Loading.OTHER: LoadStage.TRANSFORM,  # the dataset's own code, not named for a read
    Loading.COLLATE: LoadStage.COLLATE,
    Loading.HANDOVER: LoadStage.HANDOVER,
}


def stage_split(
    loading: Counter[Loading],
    workers: Counter[Loading],
    waits: Sequence[Loading | None] | None,
    lab: dict[str, object],
) -> list[Metric]:
    """The loop's wait split over the stages of loading, as watch splits its own
    (`exposed_share`, labelled `load_stage`, of the loop's samples waiting for data):
    what the loop thread was doing in each (loading its own batch at num_workers=0,
    taking one over from a worker); its samples waiting on the queue for a worker are
    split by what the workers did over the window (their samples are not aligned with
    the loop's: each stage's share of the workers' busy samples stands for it, an
    assumption the metric carries: `from_workers`). Intervals as the loop's own
    shares', from the samples in the order taken where py-spy gave it."""
    waited = sum(loading.values())
    if not waited:
        return []
    direct: Counter[LoadStage] = Counter()
    for kind, n in loading.items():
        if kind in _STAGE_OF:
            direct[_STAGE_OF[kind]] += n
    queued = waited - sum(direct.values())  # on the queue, for a worker
    busy = {k: n for k, n in workers.items() if k in _STAGE_OF}
    spread = sum(busy.values())
    shares: dict[LoadStage, float] = {s: n / waited for s, n in direct.items()}
    for kind, n in busy.items():
        if queued and spread:
            stage = _STAGE_OF[kind]
            shares[stage] = shares.get(stage, 0.0) + queued / waited * n / spread
    if queued and not spread:  # the workers sampled doing nothing: the hand-over's
        shares[LoadStage.HANDOVER] = shares.get(LoadStage.HANDOVER, 0.0) + queued / waited
    out: list[Metric] = []
    for stage, share in sorted(shares.items()):
        eff = float(waited)
        if waits is not None and len(waits) == waited:
            eff = effective_samples([_STAGE_OF.get(w) == stage if w else False for w in waits])
        low, high = wilson_effective(share * waited, waited, eff)
        ci = {
            "low95": round(low, 4),
            "high95": round(high, 4),
            "samples": waited,
            "samples_effective": round(eff, 1),
            "from_workers": bool(queued and spread),
        }
        out += _metric(f"main.wait.{stage}", share, "share", quantity=EXPOSED_SHARE,
                       load_stage=stage.value, **ci, **lab)  # fmt: skip
    return out
