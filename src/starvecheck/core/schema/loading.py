"""The stages of loading a batch, the words every layer uses for them: what a training
step waits for when it waits for data (watch, the trainers' callbacks, `loader
--factory`, attach), and what each stage's figures count.

A batch goes through these stages, in this order, before the step can use it:

  startup    the workers starting: a process made (fork, forkserver or spawn), the
             dataset unpickled in it (not under fork), worker_init_fn; every pass
             without persistent_workers
  read       the dataset's fetch (`__getitem__`, an IterableDataset's `next`) off a CPU:
             storage, the network, a sleep, a lock
  transform  the dataset's fetch on a CPU, or runnable and waiting for one: decode,
             transforms, tokenizing
  collate    the collate_fn making one batch of the samples
  handover   a worker's batch reaching the training process: the queue, shared memory,
             unpickling it there (with pin_memory, the pinning thread's hand-over too)
  pin        copying the batch into pinned memory (pin_memory=True, with CUDA)
  copy       the batch copied to the device, where the wait holds it (a trainer that
             copies before its step begins)

Each stage has two figures. *Exposed*: the part of the training loop's wait for its
batch that this stage was on the critical path of (what prefetching did not hide);
the exposed stages of a step add up to its wait. *Busy*: the stage's time per batch
wherever it ran, hidden or not (a worker's fetch while the step computes is busy and
not exposed). A fix is for the stage with the most exposed time, never for the
busiest one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import Metric
from starvecheck.core.schema.figure import Figure


class LoadStage(StrEnum):
    """A stage of loading a batch, in the order a batch goes through them."""

    STARTUP = "startup"
    READ = "read"
    TRANSFORM = "transform"
    COLLATE = "collate"
    HANDOVER = "handover"
    PIN = "pin"
    COPY = "copy"


# The stages a DataLoader worker runs (the rest run in the training process).
IN_WORKERS = (LoadStage.STARTUP, LoadStage.READ, LoadStage.TRANSFORM, LoadStage.COLLATE)

# quantity: each labelled with its `load_stage`
EXPOSED_MS = "exposed_ms"  # the stage's part of the data wait, ms a step (mean)
EXPOSED_SHARE = "exposed_share"  # ... of the whole data wait
BUSY_MS = "busy_ms"  # the stage's time per batch wherever it ran, ms (mean)
# quantity: a batch's fetch and collate with a CPU of their own (their CPU and blocked
# time, not their wait for a CPU), ms (mean): what the training process would spend
# making it at num_workers=0, where no hand-over is
SOLO_MS = "solo_ms"
# quantity: a batch made at num_workers=0 on the training process's intra-op threads,
# timed in a fresh interpreter given the loader's dataset (loading/alone.py), ms, each
# batch a run: where the hand-over holds the step back, what num_workers=0 would spend
ALONE_MS = "alone_ms"
# quantity: a batch a worker sent, freed by the process that received it (its shared
# memory let go), timed in the same fresh process, ms, each batch a run: what the
# training loop pays in its step for every batch with workers, and not at num_workers=0
RELEASE_MS = "release_ms"
# quantity: a pass's worker start-up (loading/tap.Startup), seconds
STARTUP_S = "startup_s"  # the slowest worker ready, from the pass's start
STARTUP_UNPICKLE_S = "startup_unpickle_s"  # a worker's birth to worker_init_fn
# quantity: ms a step, the start-up exposed in every pass but the first (what persistent
# workers would save: they start once)
RESTART_EXPOSED_MS = "restart_exposed_ms"
# quantity: the steps whose wait could be split (each step's wait is split, or none of it)
SPLIT_STEPS = "split_steps"
# quantity: the mean step (wait and compute) over those steps, ms: the step the stage
# figures are shares of (a trainer's first pass, its workers made before any hook, is
# not split, and its steps paid no visible start-up)
SPLIT_STEP_MS = "split_step_ms"
# quantity: over the passes after the first (their steps split): the mean step, ms; the
# mean step of the steps that did not begin a pass, ms; and a pass's mean steps. What
# persistent workers would leave: the steady step, and each pass's first batch made by
# a worker already there (`solo_ms`) once a pass
LATER_STEP_MS = "later_step_ms"
LATER_STEADY_MS = "later_steady_ms"
LATER_PASS_STEPS = "later_pass_steps"

# Batches under this many bytes are too small for the hand-over's own work (pickling,
# shared memory: about a millisecond a batch each side here) to hold a step back: where
# their hand-over still shows, the training process was waiting for a CPU to take
# them (3 processes spinning on 2 CPUs gave a 64-byte batch 40% of the wait), which
# num_workers=0 does not cure (it ran 1.4x slower there).
HANDOVER_BYTES = 1 << 20

# How the workers are started, as multiprocessing names it (the DataLoader's
# multiprocessing_context, else the platform's default)
START_METHODS = ("fork", "forkserver", "spawn")


def top_of(share: Mapping[LoadStage, float]) -> LoadStage | None:
    """The stage with the largest share of the wait (a positive one); None where none."""
    if not share:
        return None
    stage = max(share, key=lambda s: share[s])
    return stage if share[stage] > 0 else None


# --- the wait by stage as a record: what a loop's split writes (watch, the trainers'
# callbacks: loop/splits.py), each figure labelled with its quantity alone or with its
# `load_stage` besides; `to_metrics()` writes them in the order the loop wrote them,
# `from_metrics()` reads them back by labels, never raising (a figure labelled
# otherwise, loader --factory's or attach's, is left out: those stages' own).


@dataclass(frozen=True)
class StageWait:
    """One stage of loading: its exposed ms a step and share of the wait, its busy ms a
    batch wherever it ran."""

    stage: LoadStage
    exposed_ms: Figure | None = None
    exposed_share: Figure | None = None
    busy_ms: Figure | None = None


# The figures labelled with their quantity alone, their units; in the order written
# (split_steps first, restart_exposed_ms after the exposed, the rest after the busy).
_UNITS = {SPLIT_STEPS: "steps", SPLIT_STEP_MS: "ms", RESTART_EXPOSED_MS: "ms", SOLO_MS: "ms",
          ALONE_MS: "ms", RELEASE_MS: "ms", STARTUP_S: "s", STARTUP_UNPICKLE_S: "s",
          LATER_STEP_MS: "ms", LATER_STEADY_MS: "ms", LATER_PASS_STEPS: "steps"}  # fmt: skip
_PER_STAGE = {EXPOSED_MS: "ms", EXPOSED_SHARE: "fraction", BUSY_MS: "ms"}


@dataclass(frozen=True)
class LoadFigures:
    """A loop's wait by stage: the steps split, each stage's figures (in LoadStage's
    order), the start-up exposed in the passes after the first, a batch made alone
    (in the workers, and at num_workers=0 in a fresh process), and each pass's worker
    start-up."""

    split_steps: Figure | None = None
    stages: tuple[StageWait, ...] = ()
    restart_exposed_ms: Figure | None = None
    solo_ms: Figure | None = None
    startup_s: Figure | None = None
    startup_unpickle_s: Figure | None = None
    alone_ms: Figure | None = None
    release_ms: Figure | None = None
    split_step_ms: Figure | None = None
    later_step_ms: Figure | None = None
    later_steady_ms: Figure | None = None
    later_pass_steps: Figure | None = None

    @property
    def top(self) -> LoadStage | None:
        """The stage with the largest exposed share (a positive one); None where none."""
        return top_of(self.by_stage(EXPOSED_SHARE))

    def of(self, stage: LoadStage) -> StageWait:
        """The stage's figures (none where not measured)."""
        return next((s for s in self.stages if s.stage is stage), StageWait(stage))

    def by_stage(self, quantity: str) -> dict[LoadStage, float]:
        """Each stage's measured value of EXPOSED_MS, EXPOSED_SHARE or BUSY_MS."""
        return {
            s.stage: f.value
            for s in self.stages
            if (f := getattr(s, quantity)) is not None and f.value is not None
        }

    def to_metrics(self) -> tuple[Metric, ...]:
        def one(quantity: str, figure: Figure | None) -> list[Metric]:
            unit = _UNITS[quantity]
            return [] if figure is None else [figure.metric(quantity, unit, {"quantity": quantity})]

        def each(*quantities: str) -> list[Metric]:
            return [
                f.metric(f"{q}.{s.stage.value}", _PER_STAGE[q],
                         {"quantity": q, "load_stage": s.stage.value})
                for s in self.stages
                for q in quantities
                if (f := getattr(s, q)) is not None
            ]  # fmt: skip

        return (
            *one(SPLIT_STEPS, self.split_steps),
            *each(EXPOSED_MS, EXPOSED_SHARE),
            *one(RESTART_EXPOSED_MS, self.restart_exposed_ms),
            *each(BUSY_MS),
            *one(SOLO_MS, self.solo_ms),
            *one(STARTUP_S, self.startup_s),
            *one(STARTUP_UNPICKLE_S, self.startup_unpickle_s),
            *one(ALONE_MS, self.alone_ms),
            *one(RELEASE_MS, self.release_ms),
            *one(SPLIT_STEP_MS, self.split_step_ms),
            *one(LATER_STEP_MS, self.later_step_ms),
            *one(LATER_STEADY_MS, self.later_steady_ms),
            *one(LATER_PASS_STEPS, self.later_pass_steps),
        )

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> LoadFigures:
        singles: dict[str, Figure] = {}
        stages: dict[LoadStage, dict[str, Figure]] = {}
        for m in metrics:
            read = _read(m)
            if read is None:
                continue
            quantity, stage, figure = read
            if stage is None:
                singles.setdefault(quantity, figure)
            else:
                stages.setdefault(stage, {}).setdefault(quantity, figure)
        waits = tuple(StageWait(s, **stages[s]) for s in LoadStage if s in stages)
        return cls(stages=waits, **singles)

    @staticmethod
    def holds(m: Metric) -> bool:
        """Whether a metric is one of the split's figures."""
        return _read(m) is not None


def _read(m: Metric) -> tuple[str, LoadStage | None, Figure] | None:
    """(quantity, its stage or None, the figure) of a split's figure; None otherwise."""
    labels = m.labels if isinstance(m.labels, Mapping) else {}
    quantity, figure = labels.get("quantity"), Figure.of(m)
    if figure is None or not isinstance(quantity, str):
        return None
    if quantity in _UNITS and set(labels) == {"quantity"}:
        return quantity, None, figure
    stage = labels.get("load_stage")
    if (
        quantity in _PER_STAGE
        and set(labels) == {"quantity", "load_stage"}
        and stage in set(LoadStage)
    ):
        return quantity, LoadStage(str(stage)), figure
    return None
