"""A rank's sampled stacks read into shares (attach): its training loop's thread by what
it is doing (`Main`), its loading while it waits (`Loading`), its workers' and their
feeder threads', and its wait by stage of loading (waitsplit.py); each share with its
95% interval, counted from the samples in the order py-spy took them where it gave it
(core/intervals.worth: samples of one long wait are worth its runs, not their count).
The rank's part of attach's record (core/schema/attachfigures.RankFigures) they fill.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from starvecheck.core.intervals import Worth, interval, worth
from starvecheck.core.schema.attach import Interval, Loading, Main, Rank, Share
from starvecheck.core.schema.attachfigures import RankFigures
from starvecheck.core.schema.figure import Figure
from starvecheck.stages.attach import classify, waitsplit
from starvecheck.stages.attach.target import Process
from starvecheck.stages.attach.threads import loop_thread

if TYPE_CHECKING:
    from starvecheck.stages.attach.spy import Stacks

Key = tuple[int, int]
K = TypeVar("K", Main, Loading)


def figure(value: float) -> Figure:
    """A figure as attach writes it: rounded to 4 places."""
    return Figure.single(round(float(value), 4))


def _shares(
    counts: Counter[K], total: int, series: Sequence[Sequence[object]] | None = None
) -> tuple[Share[K], ...]:
    """Each kind's share of `total` samples, with its 95% interval, the samples it was
    counted from, what they are worth as independent draws and the runs that was read
    from (from each thread's kinds in the order sampled, `series`, where py-spy gave
    it, core/intervals.worth; else every sample a draw, Wilson's)."""
    out: list[Share[K]] = []
    ordered = series is not None and sum(len(x) for x in series) == total
    for kind, n in sorted(counts.items()):
        if ordered and series is not None:
            w = worth(*[[k == kind for k in x] for x in series])
        else:
            w = Worth(total, float(total), total)
        low, high = interval(n, total, w)
        ci = Interval(round(low, 4), round(high, 4), total, round(w.effective, 1), w.runs,
                      round(w.clustered, 3))  # fmt: skip
        out.append(Share(kind, figure(n / total), ci))
    return tuple(out)


def read_stacks(
    rank: Process, stacks: Stacks, src: classify.Source
) -> tuple[RankFigures, list[int], str, Rank]:
    """The shares of one rank's training loop, its loading, its workers and their
    feeder threads, from its samples (its record's part of them); the workers seen; the
    loop's `other` frames; what the loop was read from (`thread`, `loop_found`,
    `data_path`)."""
    key, found = loop_thread(stacks, rank.pid)
    main = stacks.by_thread.get(key, []) if key is not None else []
    total = sum(n for _, n in main)
    out = RankFigures(rank.pid, rank.rank, samples=figure(total))
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
    order = stacks.order.get(key) if key is not None else None
    if order is not None and len(order) != total:
        order = None  # not the samples counted: read as unordered
    if total:
        seq = [[kind_of[i] for i in order]] if order else None
        loads = [[loading_of[i] for i in order]] if order else None
        out = replace(out, main=_shares(kinds, total, seq), loading=_shares(loading, total, loads))
    worker_kinds, workers, feeding, feeders, each = _workers(rank, stacks, src)
    wtotal = sum(worker_kinds.values())
    if wtotal:
        out = replace(out, workers=_shares(worker_kinds, wtotal, each))
    if total and kinds[Main.DATA] and key is not None:
        waits, pinning = _waits(stacks, key, kind_of, loading_of, order)
        ordered = (order is not None, each is not None)
        split = waitsplit.split(waits, pinning, each or _unordered(worker_kinds), ordered)
        out = replace(out, wait=tuple(split))
    if feeders:
        out = replace(out, feeder_busy=figure(feeding / feeders))
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
) -> tuple[Counter[Loading], set[int], int, int, list[list[Loading]] | None]:
    """The workers' samples by what they did, the workers seen, of their feeder
    threads' samples the busy ones and all, and each worker's kinds in the order
    sampled (None where any worker's samples have no order)."""
    kinds: Counter[Loading] = Counter()
    workers: set[int] = set()
    feeding = feeders = 0
    each: list[list[Loading]] | None = []
    for key, samples in stacks.by_thread.items():
        if key[0] == rank.pid:
            continue
        kind_of: list[Loading | None] = []
        for frames, n in samples:
            kind = classify.worker_kind(frames, src)
            kind_of.append(kind)
            if kind is not None:
                workers.add(key[0])
                kinds[kind] += n
            busy = classify.feeder_busy(frames)
            if busy is not None:
                feeders += n
                feeding += n if busy else 0
        if not any(k is not None for k in kind_of):
            continue  # not a worker's main thread (its feeder, a thread of its own)
        order = stacks.order.get(key)
        if each is not None and order is not None and len(order) == sum(n for _, n in samples):
            each.append([k for i in order if (k := kind_of[i]) is not None])
        else:
            each = None
    return kinds, workers, feeding, feeders, each


def _waits(
    stacks: Stacks,
    key: Key,
    kind_of: Sequence[Main],
    loading_of: Sequence[Loading | None],
    order: Sequence[int] | None,
) -> tuple[list[Loading], list[Loading | None] | None]:
    """The loop thread's samples waiting for data, by what it did in each (in the
    order taken where it is known), and what the rank's pin-memory thread did at each
    of them, where its samples line up with the loop's: one py-spy samples every thread
    of the process at each tick, so a thread sampled as often as the loop's, in order,
    was sampled at the same ticks."""
    if order is None:
        waits = [x for i, x in enumerate(loading_of) if kind_of[i] == Main.DATA and x is not None]
        counts = [n for i, (_, n) in enumerate(stacks.by_thread[key]) if kind_of[i] == Main.DATA]
        return [w for w, n in zip(waits, counts, strict=False) for _ in range(n)], None
    waits = [x for i in order if kind_of[i] == Main.DATA and (x := loading_of[i]) is not None]
    for other, samples in stacks.by_thread.items():
        if other[0] != key[0] or other == key:
            continue
        pins = [classify.pin_thread_kind(frames) for frames, _ in samples]
        turn = stacks.order.get(other)
        if not any(pins) or turn is None or len(turn) != len(order):
            continue
        at_tick = [pins[j] for j in turn]
        pinning = [at_tick[t] for t, i in enumerate(order) if kind_of[i] == Main.DATA]
        return waits, pinning
    return waits, None


def _unordered(kinds: Counter[Loading]) -> list[list[Loading]]:
    """The workers' samples as one series with no order (Wilson's, where counted)."""
    return [[k for k, n in kinds.items() for _ in range(n)]]
