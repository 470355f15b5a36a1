"""One wait for a batch, split over the stages of loading that were on its critical
path: pure arithmetic on times of one clock (perf_counter; loading/stamps.py).

A batch's timeline, from the worker that made it:

  startup    [the pass began, the worker ready and    its first batch of the pass only
              its first index sent)
  fetch      [the worker free for it, collate began)  read or transform, by its CPU
  collate    [collate began, collate ended)
  handover   [collate ended, the loop has it)         the queue, shared memory, unpickling

The loop waited from `asked` to `received`. Each stage's exposed time is the part of
that interval it covers: the boundaries, clipped to the interval, partition it, so the
stages of a step add up to its wait exactly. (A worker's batch never begins after the
loop asked for it, but for start-up: the worker's previous batch was received before,
and its index sent a prefetch queue earlier; where clocks or an out-of-order loader say
otherwise, the gap is the fetch's.) The fetch is read (off a CPU: storage, the network,
sleep) or transform (on a CPU or waiting for one) in the shares its CPU and run-queue
seconds take of its wall time, which the worker measured over the whole fetch.

At num_workers=0 the training process fetches and collates inside the wait itself:
fetch [asked, collate began), collate [collate began, ended), and what follows (the
DataLoader's own bookkeeping; with pin_memory, pinning) to the end of the wait.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from starvecheck.core.schema.loading import LoadStage

STAGES = tuple(LoadStage)
INDEX = {s: i for i, s in enumerate(STAGES)}
_STARTUP, _READ, _TRANSFORM, _COLLATE, _HANDOVER, _PIN = (
    INDEX[LoadStage.STARTUP],
    INDEX[LoadStage.READ],
    INDEX[LoadStage.TRANSFORM],
    INDEX[LoadStage.COLLATE],
    INDEX[LoadStage.HANDOVER],
    INDEX[LoadStage.PIN],
)


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch's times on the shared clock, as its worker (or the training process)
    recorded them."""

    free: float  # the fetch could begin: the worker free and the batch's index there
    collate: float  # collate began
    done: float  # collate ended
    fetch_cpu: float  # the fetch's CPU and run-queue seconds (the worker's thread)
    collate_cpu: float = 0.0
    ready: float | None = None  # the worker's start-up ended, where this is its first batch
    fetch_runq: float = 0.0  # of fetch_cpu, the seconds it waited for a CPU


def _clip(t: float, low: float, high: float) -> float:
    if math.isnan(t):
        return low
    return low if t < low else high if t > high else t


def cpu_share(cpu_s: float, wall_s: float) -> float:
    """The share of a fetch's wall time on a CPU or waiting for one (0..1); all of it
    where the fetch took no measurable time."""
    if wall_s <= 0 or math.isnan(wall_s) or math.isnan(cpu_s):
        return 1.0
    return min(1.0, max(0.0, cpu_s / wall_s))


def exposed(asked: float, received: float, b: Batch) -> list[float]:
    """The seconds of the wait [asked, received] each stage covered, in STAGES' order,
    for a batch a worker made: they add up to received - asked."""
    out = [0.0] * len(STAGES)
    if received <= asked:
        return out
    # A new worker's first batch: start-up until it is ready and has its index (sent
    # once iter() has started every worker: under forkserver and spawn, seconds after
    # the first is ready).
    began = b.free if b.ready is None else max(b.free, b.ready)
    b1 = _clip(began if b.ready is not None else asked, asked, received)
    b2 = _clip(b.collate, b1, received)
    b3 = _clip(b.done, b2, received)
    out[_STARTUP] = b1 - asked
    fetch = b2 - b1
    share = cpu_share(b.fetch_cpu, b.collate - began)
    out[_TRANSFORM] = fetch * share
    out[_READ] = fetch - out[_TRANSFORM]
    out[_COLLATE] = b3 - b2
    out[_HANDOVER] = received - b3
    return out


def busy(b: Batch, handover_s: float) -> list[float]:
    """Each stage's seconds for this batch wherever it ran, hidden or not (start-up is
    a pass's, not a batch's: 0 here); the hand-over is the training process's own
    (what it waited after collate ended)."""
    out = [0.0] * len(STAGES)
    began = b.free if b.ready is None else max(b.free, b.ready)
    fetch = max(0.0, b.collate - began) if not math.isnan(began) else 0.0
    share = cpu_share(b.fetch_cpu, fetch)
    out[_TRANSFORM] = fetch * share
    out[_READ] = fetch - out[_TRANSFORM]
    out[_COLLATE] = max(0.0, b.done - b.collate)
    out[_HANDOVER] = handover_s
    return out


def solo(b: Batch) -> float:
    """The batch's fetch and collate with a CPU of their own: their wall time less the
    fetch's wait for a CPU (what the training process would take to make it alone)."""
    began = b.free if b.ready is None else max(b.free, b.ready)
    if math.isnan(began) or math.isnan(b.done):
        return 0.0
    return max(0.0, b.done - began - b.fetch_runq)


def in_process(
    asked: float, received: float, collate: float, done: float, fetch_cpu: float, pinned: bool
) -> list[float]:
    """num_workers=0: the wait is the training process making the batch. Fetch up to
    collate, collate, then the rest (pinning where pin_memory is on, else the
    DataLoader's own bookkeeping, counted with collate)."""
    out = [0.0] * len(STAGES)
    if received <= asked:
        return out
    b2 = _clip(collate, asked, received)
    b3 = _clip(done, b2, received)
    fetch = b2 - asked
    out[_TRANSFORM] = fetch * cpu_share(fetch_cpu, fetch)
    out[_READ] = fetch - out[_TRANSFORM]
    out[_COLLATE] = b3 - b2
    rest = received - b3
    out[_PIN if pinned else _COLLATE] += rest
    return out


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    if math.isnan(b0) or math.isnan(b1):
        return 0.0
    return max(0.0, min(a1, b1) - max(a0, b0))


def held(
    out: list[float], asked: float, received: float, b: Batch, busy: Sequence[Batch]
) -> list[float]:
    """The wait's hand-over, part of it given back to the workers' work that held it:
    a worker sends a finished batch from a thread of its own, and the training process
    takes its shared memory from another, both needing the interpreter's lock that the
    worker's main thread holds while it computes (a Python transform, a collate that
    copies); and every worker's batches cross one queue, so a busy worker's batch holds
    back those behind it. Over the hand-over [collate ended, received), the time the
    workers spent on `busy` batches' fetches on a CPU is those fetches' (transform), on
    their collates the collates'; the rest (fetches off a CPU: a read releases the lock;
    or waiting for one, behind the senders and the other workers) stays the hand-over's.
    (Counting a fetch's wait for a CPU as holding gave Lightning's 64 MB batches, copied
    by two workers on two CPUs, 45% of their wait as transform: the copies waited
    behind the senders' own.) `out` is exposed()'s split of the wait for `b`; `busy` the
    batches the workers made meanwhile (its own worker's next first), up to the
    hand-over itself."""
    start = max(asked, min(received, b.done if not math.isnan(b.done) else asked))
    if received <= start or not busy:
        return out
    in_fetch = in_collate = 0.0
    for nxt in busy:
        fetch_wall = nxt.collate - nxt.free
        on_cpu = nxt.fetch_cpu - nxt.fetch_runq  # waiting for a CPU, it computed nothing
        in_fetch += _overlap(start, received, nxt.free, nxt.collate) * cpu_share(on_cpu, fetch_wall)
        in_collate += _overlap(start, received, nxt.collate, nxt.done) * cpu_share(
            nxt.collate_cpu, nxt.done - nxt.collate
        )
    moved = min(out[_HANDOVER], in_fetch + in_collate)
    if moved <= 0:
        return out
    scale = moved / (in_fetch + in_collate)
    new = list(out)
    new[_TRANSFORM] += in_fetch * scale
    new[_COLLATE] += in_collate * scale
    new[_HANDOVER] -= moved
    return new
