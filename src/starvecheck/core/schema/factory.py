"""loader --factory's words: the layout its figures carry, the roles a configuration
plays (`Role`), the processes its costs are counted in (`Process`), each configuration
read as a record of its parameters (`configurations`), and its figures as records
(`FactoryFigures`: one `Measured` a configuration, with its `Settings`).

The stage fills a `FactoryFigures` once; the JSON is its serialisation: `to_metrics()`
writes the labelled metrics of schema 3 (names, labels, units, values, order),
`from_metrics()` reads them back by their labels, from a fresh result or a stored
report alike (`StageResult.records`), never raising: what it cannot read is left out.
The metrics' names and labels are spelled here alone; what judging reads off them
(`Point`, `Choice`) is in core/schema/factory_choice.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import Labels, LabelValue, Metric
from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import flag, items, number, records, text, whole
from starvecheck.core.schema import common as words
from starvecheck.core.schema import loading
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import LoadStage
from starvecheck.core.schema.record import Record

LAYOUT = "own"  # the layout label of the user's own pipeline's figures


class Role(StrEnum):
    """What a configuration is read for."""

    CURRENT = "current"  # the pipeline as the user made it, where the sweep lacks its count
    WORKERS = "workers"  # a num_workers of the sweep
    BASE = "base"  # the count the first set calls enough, read again beside its variants
    PREFETCH = "prefetch"  # ... with another prefetch_factor
    PERSISTENT = "persistent"  # ... with persistent_workers=True
    PIN = "pin"  # ... with pin_memory toggled (with CUDA)
    START = "start"  # ... under the other start method
    AGAIN = "again"  # the current configuration read again beside the variants


SWEPT = (Role.WORKERS, Role.CURRENT)  # the roles whose counts make the sweep
# The roles of a configuration read again beside the count's variants, in their rounds:
# the count itself and the current settings; never the sweep's own.
BESIDE = (Role.BASE, Role.AGAIN)
VARIANTS = (Role.PREFETCH, Role.PERSISTENT, Role.PIN)  # one setting toggled at the count


class Process(StrEnum):
    """Where a cost was counted."""

    MAIN = "main"  # the training process
    WORKER = "worker"  # one DataLoader worker
    WORKERS = "workers"  # all of them together


MAIN, WORKER, WORKERS = Process.MAIN, Process.WORKER, Process.WORKERS


@dataclass(frozen=True)
class Configuration(Record):
    """One configuration as read: its role and worker count, what it read and in how
    long."""

    role: str
    workers: int
    config: str = ""  # described: num_workers=2, pin_memory=True, ...
    stopped: str = ""  # why its reading stopped: stable, budget, epoch
    batches: int = 0
    samples: int = 0
    seconds: float = 0.0
    epochs: int = 0
    partial_window: bool = False  # its only window was cut short


@dataclass(frozen=True)
class StepRead(Record):
    """With --step-ms: the count the sweep called enough and the current settings read
    again in interleaved rounds, each with the step as a sleep after every batch
    (stages/loader/factory/stepped.py): samples a second in that loop, a figure a
    round, index i of each from round i. The count's settings as `Settings.key`."""

    workers: int
    prefetch_factor: int = 0  # as the DataLoader takes it: 2 with workers where not given
    persistent_workers: bool = False
    pin_memory: bool = False
    step_ms: float = 0.0
    current: tuple[float, ...] = ()
    changed: tuple[float, ...] = ()

    @property
    def key(self) -> tuple[int, int, bool, bool]:
        return (self.workers, self.prefetch_factor, self.persistent_workers, self.pin_memory)


class Parameters(Base):
    factory = text()  # the spec, FILE.py:FUNC
    dataset = text()  # what FUNC returned, described
    samples_in_dataset = whole()  # its len(), where it has one
    iterable = flag()  # an IterableDataset (workers run its __iter__), not map-style
    read_as_is = flag()  # FUNC returned an iterable holding no DataLoader: one configuration
    configurations = records(Configuration)
    torch_threads = whole()  # torch's intra-op threads in the measuring process
    rounds = whole()  # each configuration read this many times, in interleaved rounds
    budget_s = number()  # --budget: seconds a configuration, over its rounds
    memory_limit_bytes = whole()
    shm_free_bytes = whole()
    shards = whole()  # the dataset's own count of shards (num_shards, n_shards), if it has one
    start_method = text()  # how workers start (fork, spawn, forkserver)
    dataset_pickle_bytes = whole()  # the dataset pickled, as a forkserver or spawn worker gets it
    dataset_pickle_s = number()  # ... and the seconds pickling it took here
    dataset_pickle_error = text()  # why it could not be pickled, where it could not
    other_start_method = text()  # the start method the `start` configuration was read under
    idle_worker_uss_bytes = whole()  # a worker that has read nothing: its private memory
    current = text()  # the current configuration, described
    reread = items()
    step_read = records(StepRead)  # with --step-ms, the change read with the step


@dataclass(frozen=True)
class Settings:
    """A configuration's DataLoader settings as its figures are labelled: prefetch_factor
    as the DataLoader takes it (2 with workers where not given, 0 without)."""

    workers: int
    prefetch_factor: int
    persistent_workers: bool
    pin_memory: bool
    start_method: str | None = None  # the `start` configuration's, another start method

    @property
    def key(self) -> tuple[int, int, bool, bool]:
        return (self.workers, self.prefetch_factor, self.persistent_workers, self.pin_memory)


@dataclass(frozen=True)
class Split:
    """One stage of loading in a configuration's batches' wait: its share of the wait,
    and its busy ms a batch."""

    stage: LoadStage
    exposed_share: Figure | None = None
    busy_ms: Figure | None = None


@dataclass(frozen=True)
class VsCurrent:
    """Judging's figure of a configuration: its samples/s over the current one's, round
    by round, with its interval (advice/factory.complete writes it among the judged
    figures; a report's figures read it back)."""

    ratio: float | None = None
    low: float | None = None
    high: float | None = None


# (field, name, unit, labels past the configuration's) of each figure a configuration
# has, in the order the stage writes them: before the stage split, then after it.
Slot = tuple[str, str, str, tuple[tuple[str, LabelValue], ...]]
_Q, _P = "quantity", "process"
BEFORE: tuple[Slot, ...] = (
    ("samples_per_s", "samples_per_s", "samples/s", ((_Q, words.SAMPLES_PER_S),)),
    ("batches_per_s", "batches_per_s", "batches/s", ((_Q, words.BATCHES_PER_S),)),
    ("first_batch_s", "first_batch_s", "s", ((_Q, words.FIRST_BATCH_S),)),
    ("wait_p50_ms", "batch_wait_ms.p50", "ms", ((_Q, "batch_wait_ms"), ("percentile", 50))),
    ("wait_p99_ms", "batch_wait_ms.p99", "ms", ((_Q, "batch_wait_ms"), ("percentile", 99))),
    ("batch_bytes", "batch_bytes", "bytes", ((_Q, words.BATCH_BYTES),)),
    ("cpu_ms_main", "cpu_ms_per_sample.main", "ms", ((_Q, "cpu_ms_per_sample"), (_P, "main"))),
    ("cpu_ms_workers", "cpu_ms_per_sample.workers", "ms",
     ((_Q, "cpu_ms_per_sample"), (_P, "workers"))),
    ("runq_ms_main", "runq_ms_per_sample.main", "ms",
     ((_Q, "runq_ms_per_sample"), (_P, "main"))),
    ("runq_ms_workers", "runq_ms_per_sample.workers", "ms",
     ((_Q, "runq_ms_per_sample"), (_P, "workers"))),
    ("blocked_ms_workers", "blocked_ms_per_sample.workers", "ms",
     ((_Q, "blocked_ms_per_sample"), (_P, "workers"))),
    ("cpus_busy_main", "cpus_busy.main", "CPUs", ((_Q, "cpus_busy"), (_P, "main"))),
    ("others_cpus", "others_cpus", "CPUs", ((_Q, words.OTHERS_CPUS),)),
    ("uss_main", "uss_bytes.main", "bytes", ((_Q, "uss_bytes"), (_P, "main"))),
    ("pss_main", "pss_bytes.main", "bytes", ((_Q, "pss_bytes"), (_P, "main"))),
    ("uss_growth_main", "uss_growth_bytes.main", "bytes",
     ((_Q, "uss_growth_bytes"), (_P, "main"))),
    ("uss_worker", "uss_bytes.worker", "bytes", ((_Q, "uss_bytes"), (_P, "worker"))),
    ("pss_worker", "pss_bytes.worker", "bytes", ((_Q, "pss_bytes"), (_P, "worker"))),
    ("uss_growth_worker", "uss_growth_bytes.worker", "bytes",
     ((_Q, "uss_growth_bytes"), (_P, "worker"))),
    ("epoch_start_s", "epoch_start_s", "s", ((_Q, words.EPOCH_START_S),)),
    ("copy_ms", "copy_ms", "ms", ((_Q, "copy_ms"),)),
)  # fmt: skip
AFTER: tuple[Slot, ...] = (
    ("solo_ms", loading.SOLO_MS, "ms", ((_Q, loading.SOLO_MS),)),
    ("startup_s", loading.STARTUP_S, "s", ((_Q, loading.STARTUP_S),)),
    ("startup_unpickle_s", loading.STARTUP_UNPICKLE_S, "s", ((_Q, loading.STARTUP_UNPICKLE_S),)),
    ("repeat_share", "repeat_share", "share", ((_Q, "repeat_share"),)),
    ("samples_fingerprinted", "samples_fingerprinted", "samples",
     ((_Q, "samples_fingerprinted"),)),
    ("worker_batches", "worker_batches", "batches", ((_Q, words.WORKER_BATCHES),)),
)  # fmt: skip
SPLIT = (("exposed_share", loading.EXPOSED_SHARE, "fraction"), ("busy_ms", loading.BUSY_MS, "ms"))
RATIOS = (
    ("ratio", words.VS_CURRENT),
    ("low", words.VS_CURRENT_LOW),
    ("high", words.VS_CURRENT_HIGH),
)
_SLOTS = {tuple(sorted(labels)): slot for slot in (*BEFORE, *AFTER) for labels in [slot[3]]}


@dataclass(frozen=True)
class Measured:
    """One configuration's figures: its role, whether it is the user's own settings,
    its settings, its rates a round, first batch and later epochs' starts, waits, batch
    bytes, CPU and run-queue time a sample (training process, workers), memory, the
    stage split of its batches' wait with worker start-up, and the right-data figures
    (samples repeated, batches each worker delivered). A figure not in the run: None."""

    role: Role
    current: bool
    settings: Settings
    samples_per_s: Figure | None = None  # one figure a round
    batches_per_s: Figure | None = None
    first_batch_s: Figure | None = None
    wait_p50_ms: Figure | None = None
    wait_p99_ms: Figure | None = None
    batch_bytes: Figure | None = None  # the median batch's
    cpu_ms_main: Figure | None = None  # a sample's, in the training process
    cpu_ms_workers: Figure | None = None  # ... in all workers together
    runq_ms_main: Figure | None = None
    runq_ms_workers: Figure | None = None
    blocked_ms_workers: Figure | None = None
    cpus_busy_main: Figure | None = None
    others_cpus: Figure | None = None  # one figure a round
    uss_main: Figure | None = None
    pss_main: Figure | None = None
    uss_growth_main: Figure | None = None
    uss_worker: Figure | None = None  # one figure a worker
    pss_worker: Figure | None = None
    uss_growth_worker: Figure | None = None
    epoch_start_s: Figure | None = None  # each later epoch's start
    copy_ms: Figure | None = None
    split: tuple[Split, ...] = ()  # in LoadStage's order
    solo_ms: Figure | None = None  # a batch made alone
    startup_s: Figure | None = None  # each epoch's slowest worker ready
    startup_unpickle_s: Figure | None = None
    repeat_share: Figure | None = None
    samples_fingerprinted: Figure | None = None
    worker_batches: Figure | None = None  # in worker order
    vs_current: VsCurrent | None = None  # judging's, read from a report's figures

    @property
    def workers(self) -> int:
        return self.settings.workers

    @property
    def key(self) -> tuple[str, int, int, bool, bool]:
        """What tells configurations apart (judging's figures name it alone)."""
        return (self.role.value, *self.settings.key)

    def share(self, stage: LoadStage) -> float | None:
        """The stage's share of the batches' wait; None where not split."""
        s = next((s for s in self.split if s.stage == stage), None)
        return None if s is None or s.exposed_share is None else s.exposed_share.value

    def _base(self) -> str:
        role = "" if self.role == Role.WORKERS else f".{self.role.value}"
        return f"own.w{self.workers}{role}"

    def labels(self) -> dict[str, LabelValue]:
        s = self.settings
        out: dict[str, LabelValue] = {
            "layout": LAYOUT,
            "role": self.role.value,
            "current": self.current,
            "workers": s.workers,
            "prefetch_factor": s.prefetch_factor,
            "persistent_workers": s.persistent_workers,
            "pin_memory": s.pin_memory,
        }
        if s.start_method is not None:
            out["start_method"] = s.start_method
        return out

    def _metric(self, slot: Slot, lab: Labels) -> Metric | None:
        figure: Figure | None = getattr(self, slot[0])
        name = f"{self._base()}.{slot[1]}"
        return None if figure is None else figure.metric(name, slot[2], {**lab, **dict(slot[3])})

    def rate_metric(self) -> Metric | None:
        """Its samples/s as the JSON carries it (the capacity judging states)."""
        return self._metric(BEFORE[0], self.labels())

    def to_metrics(self) -> tuple[Metric, ...]:
        lab, base = self.labels(), self._base()
        out = [m for slot in BEFORE if (m := self._metric(slot, lab)) is not None]
        for s in self.split:
            for attr, quantity, unit in SPLIT:
                figure: Figure | None = getattr(s, attr)
                if figure is not None:
                    labels = lab | {_Q: quantity, "load_stage": s.stage.value}
                    out.append(figure.metric(f"{base}.{quantity}.{s.stage}", unit, labels))
        out += [m for slot in AFTER if (m := self._metric(slot, lab)) is not None]
        return tuple(out)

    def ratio_metrics(self, against: VsCurrent) -> tuple[Metric, ...]:
        """Judging's ratio to the current configuration, as the report's figures carry
        it (rounded; no figure where it is none, zero or infinite)."""
        s = self.settings
        lab: dict[str, LabelValue] = {
            "layout": LAYOUT,
            "role": self.role.value,
            "workers": s.workers,
            "prefetch_factor": s.prefetch_factor,
            "persistent_workers": s.persistent_workers,
            "pin_memory": s.pin_memory,
            "current": self.current,
        }
        out = []
        for attr, quantity in RATIOS:
            v = getattr(against, attr)
            if v is not None and v not in (0.0, float("inf")):
                name = f"{self._base()}.{quantity}"
                out.append(Metric.single(name, round(v, 3), "x", lab | {_Q: quantity}))
        return tuple(out)


@dataclass(frozen=True)
class FactoryFigures:
    """Every configuration's figures, in the order the stage read them."""

    configurations: tuple[Measured, ...] = ()

    def to_metrics(self) -> tuple[Metric, ...]:
        return tuple(m for c in self.configurations for m in c.to_metrics())

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> FactoryFigures:
        """The figures a result holds (judging's ratios too where given its figures;
        other stages' metrics, and any this cannot read, left out)."""
        found: dict[tuple[str, int, int, bool, bool], Measured] = {}
        for m in metrics:
            read = _read(m, found)
            if read is not None:
                found[read.key] = read
        return cls(tuple(found.values()))

    @classmethod
    def holds(cls, m: Metric, rated: Iterable[Measured]) -> bool:
        """Whether a metric is a figure of one of the configurations `rated`."""
        got = _read(m, {})
        return got is not None and any(got.key == c.key for c in rated)

    def rated(self) -> tuple[Measured, ...]:
        """The configurations with a samples/s (the rest read no window)."""
        return tuple(c for c in self.configurations if c.samples_per_s is not None)


def _settings(labels: Mapping[str, LabelValue]) -> tuple[Role, bool, Settings] | None:
    role, workers, prefetch = (
        labels.get("role"),
        labels.get("workers", 0),
        labels.get("prefetch_factor", 0),
    )
    if role not in tuple(Role) or not isinstance(workers, int) or not isinstance(prefetch, int):
        return None
    start = labels.get("start_method")
    settings = Settings(
        workers,
        prefetch,
        bool(labels.get("persistent_workers")),
        bool(labels.get("pin_memory")),
        start if isinstance(start, str) else None,
    )
    return Role(str(role)), bool(labels.get("current")), settings


def _read(m: Metric, found: Mapping[tuple[str, int, int, bool, bool], Measured]) -> Measured | None:
    """The configuration `m` is a figure of, with it read in; None where it is none."""
    labels = m.labels
    made = _settings(labels) if labels.get("layout") == LAYOUT else None
    figure = Figure.of(m)
    if made is None or figure is None:
        return None
    role, current, settings = made
    key = (role.value, *settings.key)
    c = found.get(key) or Measured(role, current, settings)
    quantity = labels.get(_Q)
    ratio = next((attr for attr, q in RATIOS if q == quantity), None)
    if ratio is not None:
        return replace(c, vs_current=replace(c.vs_current or VsCurrent(), **{ratio: m.value}))
    split = next((attr for attr, q, _ in SPLIT if q == quantity), None)
    stage = labels.get("load_stage")
    if split is not None and stage in tuple(LoadStage):
        kept = [s for s in c.split if s.stage != stage]
        now = next((s for s in c.split if s.stage == stage), Split(LoadStage(str(stage))))
        # mypy checks a **mapping against every field; these names are Figure fields.
        now = replace(now, **{split: figure})  # type: ignore[arg-type]
        parts = sorted([*kept, now], key=lambda s: STAGE_ORDER[s.stage])
        return replace(c, split=tuple(parts))
    extra = tuple(sorted((k, v) for k, v in labels.items() if k in (_Q, _P, "percentile")))
    slot = _SLOTS.get(extra)
    # mypy checks a **mapping against every field; these names are Figure fields.
    return None if slot is None else replace(c, **{slot[0]: figure})  # type: ignore[arg-type]


STAGE_ORDER = {s: i for i, s in enumerate(LoadStage)}
