"""A step breakdown's words (profile's own loop, profile --trace, watch): the runs a
trace folder holds and the ranks a breakdown compares, as records of its parameters
(`runs`, `ranks`), and its parameters typed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import LabelValue, Metric
from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import flag, items, number, records, text, whole
from starvecheck.core.schema.common import (
    BATCH_BYTES,
    DATA_WAIT_SHARE,
    GPU_IDLE_DATA_WAIT_SHARE,
    OTHERS_CPUS_EACH_S,
    PHASE_MS,
    SAMPLES_PER_S,
    STEP_MS,
)
from starvecheck.core.schema.figure import Figure, value_of
from starvecheck.core.schema.record import Record

E = TypeVar("E", bound=StrEnum)


@dataclass(frozen=True)
class Run(Record):
    """A run found in a trace folder; the first is the one analysed, each other one
    with its headline figures (or why it could not be analysed)."""

    world_size: int | None = None
    ranks: tuple[int, ...] = ()
    files: int = 0
    headline_rank: str | None = None
    data_wait_share: float | None = None
    step_ms: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Rank(Record):
    """A rank of the breakdown: its name (`rank 3`), for every kind of breakdown; the
    rest of its row is the stage's (a trace's file and devices, watch's steps)."""

    rank: str


@dataclass(frozen=True)
class Straggler(Record):
    """Judging's straggler verdict across ranks (advice/stragglers.summary): `pattern`
    'fixed' (one rank, named, the cause its steps show), 'rotating' (a different rank
    in turn) or 'none'; `slowest_in` how many common steps each rank had the most work
    in, of `steps_compared`."""

    pattern: str = "none"
    rank: str | None = None
    cause: str | None = None
    lost_share: float | None = None
    slowest_in: Mapping[str, int] = field(default_factory=dict)
    steps_compared: int = 0


class Parameters(Base):
    device = text()  # profile: the device the loop trained on
    dataloader = text()  # how batches were fetched (watch: the iterator's class)
    num_workers = whole()  # watch: the DataLoader's own
    data_wait_source = text()  # what the trace marks a fetch with
    gpu_devices = whole(absent=0)
    gpu_device = text()  # the headline GPU where a rank drives several
    runs = records(Run)  # profile --trace: the runs in the files, the one analysed first
    ranks = records(Rank)  # several ranks: one entry per rank
    headline_rank = text()  # the rank whose steps the breakdown shows
    ranks_on_host = whole()  # watch: ranks sharing this host's CPUs
    machine_cpus = number()  # watch: the machine's online CPUs (the worker model's bound)
    load_average = number()  # watch: its 1-minute load average
    rank_wait_source = text()  # watch: how the wait for the others was had
    # watch: the loop's sampler, and what its first samples of each pass say
    sampler = text()  # the DataLoader's sampler class
    sampler_shuffle = flag()
    sampler_epochs = items()  # a DistributedSampler's epoch as each of the last passes began
    same_order_passes = flag()  # the last two passes began in the same order
    ranks_same_share = number()  # of the first samples, the share every rank had
    ranks_samples_compared = whole()
    world_size = whole()
    # watch: how the DataLoader's workers are started and kept (loading/tap.py)
    start_method = text()  # fork, forkserver, spawn
    persistent_workers = flag()


# --- the figures of a step breakdown, as records (docs/architecture.md, "figures as
# records"): profile's own loop (`ProfileFigures`, a row per layout and num_workers)
# and a breakdown of one loop (`StepFigures`: profile --trace and watch, the headline
# rank's figures labelled with their quantity alone, each rank's and GPU's with its
# `rank` and `device`). The stages fill them once; `to_metrics()` writes the labelled
# metrics they wrote before, `from_metrics()` reads them back by labels, never raising.


class Phase(StrEnum):
    """A phase of profile's loop (its `record_function` names, lower case), in order."""

    DATALOADER_WAIT = "dataloader_wait"
    H2D_TRANSFER = "h2d_transfer"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class Layout(StrEnum):
    """How profile's loop stores its samples."""

    SMALL_FILES = "small_files"  # one file per sample
    MDS = "mds"  # MosaicML Streaming shards
    TEXT = "text"  # raw text tokenized in the loader (--tokenizer)


class Step(StrEnum):
    """The quantity of a step breakdown's figure (profile --trace, watch)."""

    STEPS = "steps"
    STEP_MS = STEP_MS
    PHASE_MS = PHASE_MS
    FIRST_STEP_MS = "first_step_ms"
    FIRST_WAIT_MS = "first_wait_ms"
    # watch: the later passes' first waits past their pass's usual wait, ms a step
    # (loop/splits.restart_wait_ms): workers started again, which more do not shorten
    RESTART_WAIT_MS = "restart_wait_ms"
    DATA_WAIT_SHARE = DATA_WAIT_SHARE
    DATA_WAIT_MS = "data_wait_ms"
    COMPUTE_MS = "compute_ms"
    RANK_WAIT_MS = "rank_wait_ms"  # a rank's wait for the others
    WORK_MS = "work_ms"  # a rank's step less that wait, per common step
    GPU_IDLE_SHARE = "gpu_idle_share"
    GPU_IDLE_DATA_WAIT_SHARE = GPU_IDLE_DATA_WAIT_SHARE
    GPU_IDLE_HOST_WAIT_SHARE = "gpu_idle_host_wait_share"  # its name before 0.2
    GPU_IDLE_OTHER_SHARE = "gpu_idle_other_share"
    HTA_IDLE_HOST_WAIT_RATIO = "hta_idle_host_wait_ratio"
    HTA_IDLE_KERNEL_WAIT_RATIO = "hta_idle_kernel_wait_ratio"
    HTA_IDLE_OTHER_RATIO = "hta_idle_other_ratio"
    COLLECTIVE_SHARE = "collective_share"
    MEMCPY_SHARE = "memcpy_share"
    MEMCPY_H2D_SHARE = "memcpy_h2d_share"
    MEMCPY_H2D_PAGEABLE_SHARE = "memcpy_h2d_pageable_share"
    MEMCPY_PAGEABLE_SHARE = "memcpy_pageable_share"  # its name before 0.2
    MEMCPY_D2H_SHARE = "memcpy_d2h_share"
    MEMCPY_D2D_SHARE = "memcpy_d2d_share"
    # watch: the GPU's own clock (loop/gpuclock.py)
    GPU_DATA_WAIT_MS = "gpu_data_wait_ms"
    GPU_STEP_MS = "gpu_step_ms"
    GPU_UNRESOLVED_STEPS = "gpu_unresolved_steps"
    HEADSPACE_STEP_MS = "headspace_step_ms"
    # watch: CPU time (loop/times.py)
    DATA_WAIT_CPU_MS = "data_wait_cpu_ms"
    COMPUTE_CPU_MS = "compute_cpu_ms"
    DATA_WAIT_RUNQUEUE_MS = "data_wait_runqueue_ms"
    COMPUTE_RUNQUEUE_MS = "compute_runqueue_ms"
    COMPUTE_PROCESS_CPU_MS = "compute_process_cpu_ms"
    DATA_WAIT_PROCESS_CPU_MS = "data_wait_process_cpu_ms"
    WORKER_CPU_MS = "worker_cpu_ms"
    WORKER_RUNQUEUE_MS = "worker_runqueue_ms"
    BATCH_BYTES = BATCH_BYTES
    HANDOVER_WORKER_CPU_MS = "handover_worker_cpu_ms"
    HANDOVER_MAIN_MS = "handover_main_ms"
    WORKER_START_MS = "worker_start_ms"  # one worker's start here (loop/handover.measure)
    OTHERS_CPUS_EACH_S = OTHERS_CPUS_EACH_S
    PROCESS_CPUS_EACH_S = "process_cpus_each_s"


# HolisticTraceAnalysis's idle split, in the order the trace writes it.
HTA_PARTS = (
    Step.HTA_IDLE_HOST_WAIT_RATIO,
    Step.HTA_IDLE_KERNEL_WAIT_RATIO,
    Step.HTA_IDLE_OTHER_RATIO,
)


def _labels(m: Metric) -> Mapping[str, LabelValue]:
    return m.labels if isinstance(m.labels, Mapping) else {}


def _enum(kind: type[E], value: LabelValue | None) -> E | None:
    try:
        return kind(value) if isinstance(value, str) else None
    except ValueError:
        return None


@dataclass(frozen=True)
class StepFigure:
    """One figure of a breakdown: its quantity, the figure, its unit, and which part of
    the job it is of: a phase (`phase_ms`), a rank of several, a GPU of several."""

    quantity: Step
    figure: Figure
    unit: str
    phase: Phase | None = None
    rank: str | None = None
    device: str | None = None

    @property
    def name(self) -> str:
        """The flat name: the quantity, then its phase, rank and device (`step_ms.rank_0`)."""
        where = [x for x in (self.phase, self.rank, self.device) if x is not None]
        return ".".join([self.quantity.value, *where]).replace(" ", "_")

    def metric(self) -> Metric:
        labels: dict[str, LabelValue] = {"quantity": self.quantity.value}
        labels |= {"phase": self.phase.value} if self.phase is not None else {}
        labels |= {"rank": self.rank} if self.rank is not None else {}
        labels |= {"device": self.device} if self.device is not None else {}
        return self.figure.metric(self.name, self.unit, labels)

    @classmethod
    def of(cls, m: Metric) -> StepFigure | None:
        """The breakdown's figure a metric holds; None where it holds none (a figure
        labelled otherwise, or of another quantity)."""
        labels = _labels(m)
        if not set(labels) <= {"quantity", "phase", "rank", "device"}:
            return None
        quantity, phase = _enum(Step, labels.get("quantity")), _enum(Phase, labels.get("phase"))
        rank, device = labels.get("rank"), labels.get("device")
        figure = Figure.of(m)
        if (
            quantity is None
            or figure is None
            or ("phase" in labels) != (quantity is Step.PHASE_MS and phase is not None)
            or not all(x is None or isinstance(x, str) for x in (rank, device))
            or not isinstance(m.unit, str)
        ):
            return None
        return cls(quantity, figure, m.unit, phase, rank, device)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StepFigures:
    """A breakdown's figures in the order the stage wrote them."""

    figures: tuple[StepFigure, ...] = ()

    def __iter__(self) -> Iterator[StepFigure]:
        return iter(self.figures)

    def figure(self, q: Step, rank: str | None = None) -> Figure | None:
        """The figure of this quantity (the headline's; a rank's with `rank`)."""
        return next(
            (
                f.figure
                for f in self.figures
                if f.quantity is q and f.rank == rank and f.phase is None and f.device is None
            ),
            None,
        )

    def value_of(self, q: Step, rank: str | None = None) -> float | None:
        return value_of(self.figure(q, rank))

    def measured(self, q: Step) -> Figure | None:
        """The headline figure of this quantity, where it has a value."""
        x = self.figure(q)
        return x if x is not None and x.value is not None else None

    def mean(self, q: Step) -> float | None:
        """The mean of a per-step figure (its values), else its value."""
        x = self.measured(q)
        if x is None:
            return None
        return sum(x.values) / len(x.values) if x.values else x.value

    def headline(self) -> StepFigures:
        """The headline rank's own figures, each labelled with its quantity alone."""
        return StepFigures(
            tuple(f for f in self.figures if (f.phase, f.rank, f.device) == (None, None, None))
        )

    def phases(self) -> tuple[StepFigure, ...]:
        """The headline's phases (`phase_ms` of each)."""
        return tuple(f for f in self.figures if f.phase is not None and f.rank is None)

    def ranks(self) -> tuple[str, ...]:
        """The ranks with figures of their own (labelled `rank`), in the order written."""
        return tuple(dict.fromkeys(f.rank for f in self.figures if f.rank is not None))

    def of_rank(self, rank: str) -> dict[Step, Figure]:
        """A rank's figures (a GPU's of several left out) by quantity."""
        return {
            f.quantity: f.figure
            for f in self.figures
            if f.rank == rank and f.device is None and f.phase is None
        }

    def per_rank(self, q: Step) -> dict[str, Figure]:
        """rank -> its figure of this quantity."""
        return {r: x for r in self.ranks() if (x := self.of_rank(r).get(q)) is not None}

    def devices(self) -> tuple[StepFigure, ...]:
        """Each GPU's figure, where a rank drives several (labelled `device`)."""
        return tuple(f for f in self.figures if f.device is not None)

    def replaced(self, q: Step, figure: Figure | None) -> StepFigures:
        """The figures with the headline's of this quantity replaced (None: left out)."""
        out = []
        for f in self.figures:
            if f.quantity is q and (f.phase, f.rank, f.device) == (None, None, None):
                if figure is not None:
                    out.append(replace(f, figure=figure))
            else:
                out.append(f)
        return StepFigures(tuple(out))

    def to_metrics(self) -> tuple[Metric, ...]:
        return tuple(f.metric() for f in self.figures)

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> StepFigures:
        return cls(tuple(f for m in metrics if (f := StepFigure.of(m)) is not None))


@dataclass(frozen=True)
class Scenario:
    """profile's loop at one layout and num_workers: each phase's ms a step, the step's,
    the data wait's share of the summed steps, and samples a second."""

    layout: Layout
    workers: int
    phases: tuple[tuple[Phase, Figure], ...] = ()
    step_ms: Figure | None = None
    data_wait_share: Figure | None = None
    samples_per_s: Figure | None = None

    def phase(self, phase: Phase) -> Figure | None:
        return next((f for p, f in self.phases if p is phase), None)

    def metrics(self) -> Iterator[Metric]:
        key = f"{self.layout.value}.w{self.workers}"
        where: dict[str, LabelValue] = {"layout": self.layout.value, "workers": self.workers}
        for phase, f in self.phases:
            labels = {"quantity": PHASE_MS, "phase": phase.value, **where}
            yield f.metric(f"{PHASE_MS}.{phase.value}.{key}", "ms", labels)
        for quantity, unit in _SCENARIO_UNITS.items():
            figure: Figure | None = getattr(self, quantity)
            if figure is not None:
                yield figure.metric(f"{quantity}.{key}", unit, {"quantity": quantity, **where})


_SCENARIO_UNITS = {STEP_MS: "ms", DATA_WAIT_SHARE: "fraction", SAMPLES_PER_S: "samples/s"}
RESIDENT_BEFORE = "resident_before"  # --cold: the largest share of a layout left cached


@dataclass(frozen=True)
class ProfileFigures:
    """Every figure of profile's loop: a scenario per (layout, num_workers) in the
    order run, then with --cold what eviction left cached of each layout (its largest
    share, every run's kept)."""

    scenarios: tuple[Scenario, ...] = ()
    resident: tuple[tuple[Layout, Figure], ...] = ()

    def shares(self) -> dict[tuple[Layout, int], float]:
        """The data-wait share of each (layout, num_workers) measured."""
        return {
            (s.layout, s.workers): s.data_wait_share.value
            for s in self.scenarios
            if s.data_wait_share is not None and s.data_wait_share.value is not None
        }

    def to_metrics(self) -> tuple[Metric, ...]:
        return (
            *(m for s in self.scenarios for m in s.metrics()),
            *(
                f.metric(f"{RESIDENT_BEFORE}.{lay.value}", "fraction",
                         {"quantity": RESIDENT_BEFORE, "layout": lay.value})
                for lay, f in self.resident
            ),
        )  # fmt: skip

    @staticmethod
    def holds(m: Metric) -> bool:
        """Whether a metric is a scenario's figure (what the loop's table takes)."""
        return bool(ProfileFigures.from_metrics((m,)).scenarios)

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> ProfileFigures:
        scenarios: dict[tuple[Layout, int], Scenario] = {}
        resident: list[tuple[Layout, Figure]] = []
        for m in metrics:
            labels, figure = _labels(m), Figure.of(m)
            layout, workers = _enum(Layout, labels.get("layout")), labels.get("workers")
            quantity = labels.get("quantity")
            if figure is None or layout is None:
                continue
            if quantity == RESIDENT_BEFORE and set(labels) == {"quantity", "layout"}:
                resident.append((layout, figure))
            if not isinstance(workers, int) or isinstance(workers, bool):
                continue
            was = scenarios.get((layout, workers), Scenario(layout, workers))
            phase = _enum(Phase, labels.get("phase"))
            if quantity == PHASE_MS and phase is not None:
                scenarios[layout, workers] = replace(was, phases=(*was.phases, (phase, figure)))
            elif quantity in _SCENARIO_UNITS and "phase" not in labels:
                # mypy checks a **mapping against every field; these names are Figure fields.
                scenarios[layout, workers] = replace(was, **{str(quantity): figure})  # type: ignore[arg-type]
        return cls(tuple(scenarios.values()), tuple(resident))
