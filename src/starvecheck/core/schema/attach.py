"""attach's words: what a sampled stack is doing (the kinds its shares are labelled
with), what its figures count, each rank read and each GPU seen as records of its
parameters (`ranks`, `gpus`), and a share as a record (`Share`, `WaitPart`: its kind,
its figure, its interval), written to its metric's labels and read back from them
(`read_share`). A run's figures as a whole are core/schema/attachfigures.py's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import Labels, LabelValue, Metric
from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import mapping, number, records, text
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import EXPOSED_SHARE, LoadStage
from starvecheck.core.schema.record import Record


class Main(StrEnum):
    """What the training loop's thread is doing in a sample (stages/attach/classify),
    in the order a breakdown shows them."""

    DATA = "data"  # waiting for the next batch
    STEP = "step"  # the model's step
    COPY = "copy"  # copying a batch to the device
    GPU_WAIT = "gpu-wait"  # synchronising with the GPU
    COLLECTIVE = "collective"  # in a collective (all-reduce, barrier)
    OTHER = "other"


class Loading(StrEnum):
    """What a DataLoader worker (or the main thread while it loads) is doing."""

    READ = "read"
    DECODE = "decode"
    TOKENIZE = "tokenize"
    COLLATE = "collate"
    HANDOVER = "handover"
    # workers starting: made, the dataset unpickled in a spawned one, worker_init_fn;
    # the stage of loading's own word (core/schema/loading.py)
    STARTUP = LoadStage.STARTUP.value
    PIN = LoadStage.PIN.value  # pinning a batch (the loop's own, at num_workers=0)
    IDLE = "idle"
    OTHER = "other"


# quantity: attach's own figures (probe/load.py's and /proc's, per rank)
GPU_UTILIZATION = "gpu_utilization"
WORKER_USS_GROWTH = "worker_uss_growth"
WORKERS_BLOCKED_SHARE = "workers_blocked_share"
WORKERS_CPUS = "workers_cpus"
WORKERS_FOUND = "workers_found"
WORKERS_RUNQ_CPUS = "workers_runq_cpus"
MAIN_SHARE = "main_share"  # the loop's thread, by Main
MAIN_LOADING_SHARE = "main_loading_share"  # the loop's thread while it loads, by Loading
WORKER_SHARE = "worker_share"  # the workers, by Loading


@dataclass(frozen=True)
class Rank(Record):
    """One process of the job as read: who it is, its workers, where its loop was
    found, and what became of it over the window."""

    pid: int
    rank: int | None = None
    command: str = ""
    workers: tuple[int, ...] = ()
    thread: str | None = None  # the thread its loop runs in
    loop_found: bool | None = None  # None: not looked for (no stacks)
    data_path: str | None = None  # the frame its batches come through
    stopped_s: float = 0.0  # stopped (State T) this long
    ended: str | None = None  # how it ended (exited, exec'd, ...), where it did
    ended_at_s: float | None = None


@dataclass(frozen=True)
class Gpu(Record):
    """A GPU the job uses, with the PIDs of the job's and of others on it."""

    index: int
    name: str = ""
    job_pids: tuple[int, ...] = ()
    other_pids: tuple[int, ...] = ()


class Parameters(Base):
    seconds = number()  # the seconds sampled
    ranks = records(Rank)
    gpus = records(Gpu)
    gpu_read = text()  # how the job's GPUs were told, or why none were read
    other_frames = mapping()  # each process's `other` frames (pid -> words)


# --- a share -------------------------------------------------------------------------

K = TypeVar("K", Main, Loading)
T = TypeVar("T")
Who = dict[str, LabelValue]  # a rank's labels: {"rank": ..., "pid": ...}


@dataclass(frozen=True)
class Interval:
    """A share's 95% interval as the stage counted it (labels `low95`, `high95`), the
    samples it was counted from, what they are worth as independent draws, the runs
    that was read from and their clustering (stages/attach/shares.py); each None where
    a report does not hold it (one from before intervals were kept)."""

    low: float | None = None
    high: float | None = None
    samples: float | None = None
    effective: float | None = None
    runs: float | None = None
    clustered: float | None = None  # a share's; the wait's split has none

    def labels(self) -> dict[str, LabelValue]:
        pairs = (("low95", self.low), ("high95", self.high), ("samples", self.samples),
                 ("samples_effective", self.effective), ("runs", self.runs),
                 ("clustered", self.clustered))  # fmt: skip
        return {k: v for k, v in pairs if v is not None}


@dataclass(frozen=True)
class Share(Generic[K]):
    """One kind's share of a thread's samples (the loop's by `Main`; its loading and
    the workers' by `Loading`), with its interval."""

    kind: K
    figure: Figure
    interval: Interval = Interval()

    @property
    def value(self) -> float | None:
        return self.figure.value

    def metric(self, quantity: str, who: Who) -> Metric:
        """Its metric among the rank's (`who`) shares of this quantity (SHARES)."""
        labels = {"quantity": quantity, "kind": self.kind.value, **self.interval.labels()}
        name = f"attach.{SHARES[quantity]}.{self.kind.value}"
        return self.figure.metric(name, "share", labels | who)


@dataclass(frozen=True)
class WaitPart:
    """A stage of loading's share of the loop's samples waiting for data, with its
    interval, and whether the workers' samples over the window stood for part of it
    (None: not said)."""

    stage: LoadStage
    figure: Figure
    interval: Interval = Interval()
    from_workers: bool | None = None

    @property
    def value(self) -> float | None:
        return self.figure.value

    def metric(self, who: Who) -> Metric:
        """Its metric among the rank's (`who`)."""
        labels: dict[str, LabelValue] = {"quantity": EXPOSED_SHARE, "load_stage": self.stage.value}
        labels |= self.interval.labels()
        labels |= {} if self.from_workers is None else {"from_workers": self.from_workers}
        return self.figure.metric(f"attach.{WAIT_STEM}.{self.stage.value}", "share", labels | who)


def share_of(shares: Sequence[Share[K]], kind: K) -> Share[K] | None:
    """The first share of this kind (None where none was sampled)."""
    return next((s for s in shares if s.kind == kind), None)


# The shares' quantities and their names' stems, in the order the stage writes them.
SHARES = {MAIN_SHARE: "main", MAIN_LOADING_SHARE: "main.loading", WORKER_SHARE: "workers"}
WAIT_STEM = "main.wait"
GROUP = {MAIN_SHARE: "main", MAIN_LOADING_SHARE: "loading", WORKER_SHARE: "workers"}


def _num(x: LabelValue | None) -> float | None:
    return x if isinstance(x, int | float) and not isinstance(x, bool) else None


def whole(x: LabelValue | None) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def labels_of(m: Metric) -> Labels:
    return m.labels if isinstance(m.labels, Mapping) else {}


def who_of(labels: Labels) -> tuple[int, int | None] | None:
    """(pid, rank) of a rank's figure; None where its labels do not say them."""
    pid, rank = whole(labels.get("pid")), labels.get("rank")
    if pid is None or not (rank is None or whole(rank) is not None):
        return None
    return pid, whole(rank)


def interval(labels: Labels) -> Interval:
    """A share's interval as its labels hold it (each part None where they do not)."""
    keys = ("low95", "high95", "samples", "samples_effective", "runs", "clustered")
    return Interval(*(_num(labels.get(k)) for k in keys))


def _enum(kind: type[T], x: LabelValue | None) -> T | None:
    try:
        return kind(x) if isinstance(x, str) else None  # type: ignore[call-arg]
    except ValueError:
        return None


def read_share(m: Metric) -> tuple[str, Share[Main] | Share[Loading] | WaitPart] | None:
    """(the field of a rank's record it joins, the share) of a share's metric; None
    where it is none, or one the record cannot read."""
    figure, labels = Figure.of(m), labels_of(m)
    quantity = labels.get("quantity")
    if figure is None or who_of(labels) is None:
        return None
    if quantity == EXPOSED_SHARE:
        stage = _enum(LoadStage, labels.get("load_stage"))
        given = labels.get("from_workers")
        if stage is None or not (given is None or isinstance(given, bool)):
            return None
        return "wait", WaitPart(stage, figure, interval(labels), given)
    if quantity == MAIN_SHARE:
        main = _enum(Main, labels.get("kind"))
        return None if main is None else ("main", Share(main, figure, interval(labels)))
    if isinstance(quantity, str) and quantity in GROUP:
        loading = _enum(Loading, labels.get("kind"))
        share = None if loading is None else Share(loading, figure, interval(labels))
        return None if share is None else (GROUP[quantity], share)
    return None
