"""What a loop's wait for data is made of, by stage (core/schema/loading.py), and the
fix for the stage that holds the step back.

The figures are the loop's own (watch, the trainers' callbacks): each stage's exposed
ms a step (its part of the wait: what prefetching did not hide) and share of the wait,
each stage's busy ms a batch (wherever it ran), each pass's worker start-up. The stage
with the largest exposed share is the one a fix must reach:

  read, transform, collate   the workers' own work: more workers where the machine has
                             room (the worker model, advice/stepworkers.py); a read
                             waits, so workers (or threads inside the dataset) may
                             outnumber the CPUs; a transform or collate is CPU work
  startup                    workers started every pass: persistent_workers=True saves
                             the start-up of every pass but the first, measured
  handover                   the batch's way to the training process: more workers do
                             not shorten it; fewer bytes a batch, or no workers where
                             the work per batch is small (measured by loader --factory)
  pin, copy                  the host's side of the copy to the device

A stage whose fix no setting reaches gets no predicted figure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from starvecheck.core.metric import Metric
from starvecheck.core.model import Gain, GainKind
from starvecheck.core.paired import MARGIN
from starvecheck.core.schema.figure import value_of
from starvecheck.core.schema.loading import (
    BUSY_MS,
    EXPOSED_MS,
    EXPOSED_SHARE,
    HANDOVER_BYTES,
    LoadFigures,
    LoadStage,
    top_of,
)

# What each stage is, as a person reads it in a finding.
MEANING = {
    LoadStage.STARTUP: "workers starting",
    LoadStage.READ: "the dataset's fetch off a CPU (storage, the network, a sleep, a lock)",
    LoadStage.TRANSFORM: "the dataset's fetch on a CPU (decode, transforms, tokenizing)",
    LoadStage.COLLATE: "collate_fn making the batch",
    LoadStage.HANDOVER: "the batch's way from a worker to the training process",
    LoadStage.PIN: "pinning the batch",
    LoadStage.COPY: "the copy to the device",
}
# The stages more workers reach: the workers' own work.
WORKERS_REACH = (LoadStage.READ, LoadStage.TRANSFORM, LoadStage.COLLATE)
SAID_SHARE = 0.02  # a stage under this share of the wait is left out of the sentence


@dataclass(frozen=True)
class Waits:
    """The split as judging reads it; `top` the stage with the largest exposed share."""

    exposed_ms: Mapping[LoadStage, float]
    share: Mapping[LoadStage, float]
    busy_ms: Mapping[LoadStage, float]
    steps: int
    startup_s: float | None = None  # a pass's slowest worker ready (median over passes)
    unpickle_s: float | None = None  # a worker's birth to worker_init_fn (its unpickling)
    restart_ms: float | None = None  # start-up exposed in later passes, ms a step
    solo_ms: float | None = None  # a batch made alone (no wait for a CPU), ms
    # a batch made at num_workers=0 in a fresh process (median ms, batches timed)
    alone_ms: float | None = None
    alone_runs: int = 0
    release_ms: float | None = None  # a batch a worker sent, freed by its receiver (median ms)
    step_ms: float | None = None  # the mean step over the steps split
    # the later passes (split): the mean step, that of the steps not beginning a pass,
    # and a pass's mean steps
    later_step_ms: float | None = None
    later_steady_ms: float | None = None
    later_pass_steps: float | None = None

    @property
    def top(self) -> LoadStage | None:
        return top_of(self.share)


def read(metrics: Sequence[Metric]) -> Waits | None:
    """The split of a loop's figures; None where the wait was not split."""
    return of(LoadFigures.from_metrics(metrics))


def of(figures: LoadFigures) -> Waits | None:
    """The split as judging reads it, from its record (`StageResult.records(LoadFigures)`);
    None where the wait was not split."""
    steps = value_of(figures.split_steps)
    share = figures.by_stage(EXPOSED_SHARE)
    if not steps or not share:
        return None
    return Waits(
        exposed_ms=figures.by_stage(EXPOSED_MS),
        share=share,
        busy_ms=figures.by_stage(BUSY_MS),
        steps=int(steps),
        startup_s=value_of(figures.startup_s),
        unpickle_s=value_of(figures.startup_unpickle_s),
        restart_ms=value_of(figures.restart_exposed_ms),
        solo_ms=value_of(figures.solo_ms),
        alone_ms=value_of(figures.alone_ms),
        alone_runs=figures.alone_ms.n if figures.alone_ms is not None else 0,
        release_ms=value_of(figures.release_ms),
        step_ms=value_of(figures.split_step_ms),
        later_step_ms=value_of(figures.later_step_ms),
        later_steady_ms=value_of(figures.later_steady_ms),
        later_pass_steps=value_of(figures.later_pass_steps),
    )


def sentence(w: Waits) -> str:
    """The split in words: each stage's share of the wait (and ms a step), largest
    first, those under SAID_SHARE left out."""
    parts = [
        f"{s.value} {w.share[s]:.0%} ({w.exposed_ms.get(s, 0.0):,.1f} ms)"
        for s in sorted(w.share, key=lambda s: -w.share[s])
        if w.share[s] >= SAID_SHARE
    ]
    top = w.top
    head = f"By stage (over {w.steps} steps; exposed: what prefetching did not hide), the wait is "
    said = head + ", ".join(parts) if parts else head + "spread thin"
    if top is not None:
        said += f"; {top.value}: {MEANING[top]}"
    return said


def startup_fix(
    w: Waits, step_ms: float | None, workers: int | None, method: str | None
) -> tuple[str, Gain, dict[str, bool]] | None:
    """Workers started every pass hold the step back: persistent_workers=True, with what
    it saves (the start-up exposed in the passes after the first), where measured."""
    if w.top is not LoadStage.STARTUP:
        return None
    how = f" under {method}" if method else ""
    each = f" ({workers} workers{how}" if workers else f" (workers{how}"
    startup = f"{w.startup_s:,.2f} s" if w.startup_s is not None else "its time"
    said = (
        f"Every pass starts its workers again{each}): the slowest is ready {startup} after "
        "the pass began"
    )
    if w.unpickle_s is not None and method in ("forkserver", "spawn"):
        said += (
            f", {w.unpickle_s:,.2f} s of it the worker's own start (the interpreter, its "
            f"imports and the dataset unpickled: {method} sends each worker the whole dataset)"
        )
    said += (
        ". Keep them between passes: `DataLoader(..., persistent_workers=True)` (they then "
        "keep their memory between passes). A dataset that pickles small (open files and "
        "load arrays in the worker, not in __init__) shortens every start"
    )
    if method in ("forkserver", "spawn"):
        said += "; so does the fork start method, where the job can use it"
    said += "."
    fix = {"persistent_workers": True}
    later = _kept_workers(w)
    if later is not None:
        return said, later, fix
    # The step with no start-up in it: the mean step less every pass's start-up exposed
    # (the first pass's too), both over the steps split (a trainer's first pass is not:
    # its workers start before any hook, and the loop's mean step has that pass in it).
    step_ms = w.step_ms if w.step_ms is not None else step_ms
    kept = None if step_ms is None else step_ms - w.exposed_ms.get(LoadStage.STARTUP, 0.0)
    if w.restart_ms is None or kept is None or kept <= 0:
        share = round(w.share[LoadStage.STARTUP], 4)
        return (
            said,
            Gain(GainKind.STEP_SHARE, share, "the start-up's share of the wait; at most"),
            fix,
        )
    ratio = (kept + w.restart_ms) / kept
    basis = (
        f"predicted: a pass's mean step from {kept + w.restart_ms:,.1f} ms to {kept:,.1f} ms, "
        f"the {w.restart_ms:,.1f} ms a step each pass after the first waited for its "
        "workers to start (measured) saved; the first pass still starts them"
    )
    return said, Gain(GainKind.THROUGHPUT, round(ratio, 2), basis), fix


def start_each_ms(w: Waits | None, workers: int | None, one_start_ms: float | None = None) -> float:
    """What each worker added costs every later pass, in ms a step: a pass's workers
    start one after another (the slowest ready `startup_s` after the pass began, over
    `workers`), once in a later pass's `later_pass_steps` steps. At num_workers=0, one
    worker's start as loop/handover.measure timed it in this process (`one_start_ms`).
    0 where not measured (persistent workers start once). On Lightning, 3 epochs of 60
    steps: 4 workers' restart took 28 ms more than 2 workers'; from num_workers=0,
    leaving the start out put transformers' collate +17% beside a CPU burner."""
    if w is None or not w.later_pass_steps:
        return 0.0
    if not workers:
        return max(0.0, one_start_ms or 0.0) / w.later_pass_steps
    if w.startup_s is None:
        return 0.0
    return w.startup_s * 1e3 / workers / w.later_pass_steps


def _kept_workers(w: Waits) -> Gain | None:
    """persistent_workers=True's gain over the later passes: their mean step now, against
    their steady step (the steps that did not begin a pass) plus each pass's first
    batch made by a worker already there (`solo_ms`) once a pass. None where a figure is
    missing. (The start-up's exposed share alone left the rest of a fresh worker's first
    batch in the step: Lightning's later epochs ran 17% faster than it said.)"""
    now, steady, steps, solo = w.later_step_ms, w.later_steady_ms, w.later_pass_steps, w.solo_ms
    if now is None or steady is None or not steps or solo is None or steady <= 0:
        return None
    after = steady + solo / steps
    if after >= now:
        return None
    basis = (
        f"predicted: a later pass's mean step from {now:,.1f} ms to {after:,.1f} ms: its "
        f"steps but the first {steady:,.1f} ms, and its first batch made by a worker "
        f"already there ({solo:,.1f} ms) once in {steps:,.0f} steps (measured); the first "
        "pass still starts them"
    )
    return Gain(GainKind.THROUGHPUT, round(now / after, 2), basis)


@dataclass(frozen=True)
class LoopThread:
    """The training loop's thread in a mean step (ms): its CPU in the data wait, and its
    CPU and its wait for a CPU in the compute (0 where not read). The wait's own wait for
    a CPU is not here: the step kept at num_workers=0 does not hold it (_rest_at_zero)."""

    wait_cpu_ms: float = 0.0
    compute_cpu_ms: float = 0.0
    compute_runq_ms: float = 0.0


def handover_fix(
    w: Waits,
    batch_bytes: float | None,
    step_ms: float | None,
    compute_ms: float | None,
    workers: int | None,
    thread: LoopThread | None = None,
) -> tuple[str, Gain, dict[str, int]] | None:
    """The hand-over holds the step back: more workers do not shorten it (batches of
    HANDOVER_BYTES or more; smaller ones: None, the worker advice speaks). Where making
    a batch in the training process and the step's compute take less than the step now,
    num_workers=0 hands nothing over: that, with its predicted figure; else fewer bytes
    a batch, with no figure (no setting reaches it: the share is an upper bound). The
    batch's making is the one timed at num_workers=0 in a fresh process (loading/
    alone.py: the training process's threads, its own memory) where there is one, with
    the pinning it would then do itself; else the workers' own (a CPU each, one thread,
    shared memory: slower than the training process where its threads help). With the
    former, the rest of the step at num_workers=0 is what the loop's thread does now
    besides waiting for its batch: the compute and the wait's CPU (a trainer's own work
    in its fetch), less what the workers cost it: its wait for a CPU (they held the
    CPUs) and freeing each batch a worker sent (timed in the same process; at most the
    thread's CPU, in the wait or the compute, wherever the loop lets the batch go); with
    the latter, the compute now (a bound: never more gain than there is)."""
    if w.top is not LoadStage.HANDOVER or not batch_bytes or batch_bytes < HANDOVER_BYTES:
        return None
    size = f" of {batch_bytes / 1e6:,.1f} MB"
    said = (
        f"Each batch{size} takes {w.exposed_ms.get(LoadStage.HANDOVER, 0.0):,.1f} ms a step to "
        "reach the training process after its worker finished it (the queue, shared memory, "
        "unpickling; with pin_memory, the pinning thread): more workers do not shorten it"
    )
    made = _made_at_zero(w)
    if workers and made is not None and step_ms and compute_ms is not None:
        ms, where, how = made
        kept, rest = _rest_at_zero(w, compute_ms, thread or LoopThread())
        alone = kept + ms
        if kept > 0 and step_ms / alone >= 1 + MARGIN:
            said += (
                f". Making a batch takes {ms:,.1f} ms {where} and the rest of the step "
                f"{kept:,.1f} ms{rest}: loading in the training process hands nothing over, "
                "`DataLoader(..., num_workers=0)`. Or send fewer bytes a batch (uint8 images "
                "normalised on the device, int32 token ids) and keep the workers."
            )
            basis = (
                f"predicted: the mean step from {step_ms:,.1f} ms to {alone:,.1f} ms (the "
                f"step's compute and a batch made {how}, one after the other); the hand-over "
                "and the wait for it gone"
            )
            return (
                said,
                Gain(GainKind.THROUGHPUT, round(step_ms / alone, 2), basis),
                {"num_workers": 0},
            )
        if w.alone_ms is not None and kept > 0:
            said += (
                f". num_workers=0 would not be faster: a batch takes {ms:,.1f} ms {where}, "
                f"and the rest of the step {kept:,.1f} ms{rest} (against {step_ms:,.1f} ms now)"
            )
    said += (
        ". Send fewer bytes a batch (uint8 images normalised on the device, int32 token ids, "
        "no copies of shared tensors)"
    )
    if w.alone_ms is None:
        said += (
            ", or, where a batch takes little work to make, load it in the training "
            "process: `starvecheck loader --factory FILE.py:FUNC` measures num_workers=0, "
            "which hands nothing over, against your count"
        )
    gain = Gain(
        GainKind.STEP_SHARE,
        round(w.share[LoadStage.HANDOVER], 4),
        "the hand-over's share of the wait, were it free; at most (no setting reaches it alone)",
    )
    return said + ".", gain, {}


def _rest_at_zero(w: Waits, compute_ms: float, t: LoopThread) -> tuple[float, str]:
    """(ms, said) the step less the batch's making at num_workers=0: where that making
    was timed there, the compute and the wait's CPU now less the loop thread's wait for
    a CPU in the compute and the freeing of each batch a worker sent (both the workers'
    doing; the freeing at most the thread's CPU, where it runs); else the compute now.
    The wait's own wait for a CPU is not in what is kept (its CPU is), so it is not
    taken from it: taken, watch's 64 MB hand-over beside a CPU burner kept 2-3 ms of a
    5 ms step and promised 1.50x for 1.30x."""
    if w.alone_ms is None:
        return compute_ms, ""
    cpu = max(0.0, t.wait_cpu_ms) + max(0.0, t.compute_cpu_ms)
    release = min(w.release_ms or 0.0, cpu)
    runq = max(0.0, t.compute_runq_ms)
    now = compute_ms + max(0.0, t.wait_cpu_ms)
    parts = [f"{runq:,.1f} ms waiting for a CPU"] if runq > 0 else []
    if release > 0:
        parts.append(f"{release:,.1f} ms freeing the batch a worker sent (measured)")
    said = (
        f" ({compute_ms:,.1f} ms of compute and {max(0.0, t.wait_cpu_ms):,.1f} ms of the "
        f"wait's CPU now, less {' and '.join(parts)})"
        if parts
        else ""
    )
    return now - runq - release, said


def _made_at_zero(w: Waits) -> tuple[float, str, str] | None:
    """(ms, where said, how said) a batch takes to make at num_workers=0: timed there in
    a fresh process, with the pinning the training process would then do itself; else
    the workers' own time with a CPU each; None where neither was measured."""
    pin = w.busy_ms.get(LoadStage.PIN, 0.0)
    if w.alone_ms is not None:
        pinned = f" and {pin:,.1f} ms pinning it" if pin > 0 else ""
        where = (
            f"at num_workers=0 (timed over {w.alone_runs} batches in a fresh process given "
            f"your dataset, on the training process's threads){pinned}"
        )
        return w.alone_ms + pin, where, "at num_workers=0 (measured)"
    if w.solo_ms is not None:
        return w.solo_ms, "with a CPU of its own (measured in the workers)", "alone"
    return None


def configuration_said(
    share: Callable[[LoadStage], float | None], who: str, what: str = "each batch's wait is"
) -> str:
    """A `loader --factory` configuration's batches' wait by stage, in words (`share`:
    a stage's share of it, core/schema/factory.Measured.share); "" where it was not
    split."""
    shares = {s: share(s) for s in LoadStage}
    said = {s: v for s, v in shares.items() if v is not None and v >= SAID_SHARE}
    if not said:
        return ""
    parts = ", ".join(f"{s.value} {v:.0%}" for s, v in sorted(said.items(), key=lambda x: -x[1]))
    top = max(said, key=lambda s: said[s])
    return f"; {who}: {what} {parts} ({top.value}: {MEANING[top]})"
