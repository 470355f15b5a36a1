"""attach's figures as records (`AttachFigures`): each rank's (its shares, its wait by
stage of loading, /proc's), the machine's, each GPU's utilization, attach's own
sampling's; label values as core/schema/attach.py's enums.

The stage fills an `AttachFigures` once; the JSON is its serialisation: `to_metrics()`
writes the labelled metrics of schema 3 (names, labels and their order, units, values,
the order of the metrics), `from_metrics()` reads them back by their labels, from a
fresh result or a stored report alike (`StageResult.records`), never raising: what it
cannot read is left out (a label of the wrong type, a kind no enum holds); of two
figures of one quantity for one rank, the first is kept, as a read by label was. The
order is kept where the record can say it: a rank's shares in the order read, the
ranks in the order their figures come (their sampling's, after the machine's, merged
in), and whether the machine's figures came before the ranks'. The metrics' names
are spelled here alone (a share's in core/schema/attach.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from starvecheck.core.metric import Labels, Metric
from starvecheck.core.schema.attach import (
    GPU_UTILIZATION,
    MAIN_LOADING_SHARE,
    MAIN_SHARE,
    WORKER_SHARE,
    WORKER_USS_GROWTH,
    WORKERS_BLOCKED_SHARE,
    WORKERS_CPUS,
    WORKERS_FOUND,
    WORKERS_RUNQ_CPUS,
    Loading,
    Main,
    Share,
    WaitPart,
    Who,
    labels_of,
    read_share,
    who_of,
    whole,
)
from starvecheck.core.schema.common import OTHERS_CPUS, OTHERS_CPUS_EACH_S, SAMPLES
from starvecheck.core.schema.figure import Figure

# field -> (quantity, the metric's name after `attach.`, unit): the figures the JSON
# carries of each rank (labelled `rank`, `pid`), in the order the stage writes them;
# those of its sampling (SAMPLED) after the machine's and the GPUs'.
RANK_FIGURES = {
    "samples": (SAMPLES, "main.samples", "samples"),  # its loop's, before its shares
    "feeder_busy": ("feeder_busy_share", "workers.feeder_busy", "share"),
    "workers_found": (WORKERS_FOUND, "workers.found", "workers"),
    "dropped": ("dropped", "dropped", "samples"),
    "main_cpus": ("main_cpus", "main.cpu", "CPUs"),
    "main_thread_cpus": ("main_thread_cpus", "main.thread_cpu", "CPUs"),
    "main_uss_growth": ("main_uss_growth", "main.uss_growth", "bytes"),
    "main_read": ("main_read_bytes_per_s", "main.read", "bytes/s"),
    "main_cpus_each_s": ("main_cpus_each_s", "main.cpu_each_s", "CPUs"),
    "workers_cpus": (WORKERS_CPUS, "workers.cpu", "CPUs"),
    "workers_runq": (WORKERS_RUNQ_CPUS, "workers.runq", "CPUs"),
    "workers_blocked": (WORKERS_BLOCKED_SHARE, "workers.blocked", "share"),
    "worker_uss_growth": (WORKER_USS_GROWTH, "workers.uss_growth", "bytes"),
    "workers_read": ("workers_read_bytes_per_s", "workers.read", "bytes/s"),
    "not_taken": ("samples_not_taken", "sampler.not_taken", "samples"),
    "behind": ("sampler_behind_s", "sampler.behind", "s"),
    "workers_not_sampled": ("workers_not_sampled", "workers.not_sampled", "workers"),
}
SAMPLED = ("not_taken", "behind", "workers_not_sampled")
# field -> (quantity, name, unit): the machine's over the window
MACHINE_FIGURES = {
    "others_cpus": (OTHERS_CPUS, "machine.others_cpus", "CPUs"),
    "load_average": ("load_average", "machine.load_average", "tasks"),
    "machine_cpus": ("machine_cpus", "machine.machine_cpus", "CPUs"),
    "nr_periods": ("nr_periods", "machine.nr_periods", "periods"),
    "nr_throttled": ("nr_throttled", "machine.nr_throttled", "periods"),
    "throttled_s": ("throttled_s", "machine.throttled_s", "s"),
    "shm_used_bytes": ("shm_used_bytes", "machine.shm_used_bytes", "bytes"),
    "shm_growth_bytes": ("shm_growth_bytes", "machine.shm_growth_bytes", "bytes"),
    "others_cpus_each_s": (OTHERS_CPUS_EACH_S, "machine.others_cpus_each_s", "CPUs"),
}
# field -> (quantity, name, unit): attach's own sampling (py-spy), after the GPUs'
SAMPLER_FIGURES = {
    "rate": ("sampler_rate", "sampler.rate", "samples/s"),
    "rate_first": ("sampler_rate_first", "sampler.rate_first", "samples/s"),  # restarted
    "cpus": ("sampler_cpus", "sampler.cpu", "CPUs"),
    "cpu_seconds": ("sampler_cpu_seconds", "sampler.cpu_s", "s"),
    "budget_cpus": ("sampler_budget_cpus", "sampler.budget", "CPUs"),
    "steady_cpus": ("sampler_steady_cpus", "sampler.cpu_steady", "CPUs"),
}
Table = dict[str, tuple[str, str, str]]


def _figures(record: object, table: Table, labels: Who, only: Sequence[str]) -> Iterator[Metric]:
    for name in only:
        figure: Figure | None = getattr(record, name)
        if figure is not None:
            quantity, metric, unit = table[name]
            yield figure.metric(f"attach.{metric}", unit, {"quantity": quantity, **labels})


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures: its loop's samples and their shares (`main`), its loading
    while it waits (`loading`), its workers' (`workers`), its wait by stage of loading
    (`wait`); /proc's (CPU, run queue, memory, reads of it and its workers: `main_*`,
    `workers_*`); the workers found, the samples dropped and not taken (RANK_FIGURES).
    `rank`: its rank (None: not under torch.distributed)."""

    pid: int
    rank: int | None = None
    samples: Figure | None = None
    main: tuple[Share[Main], ...] = ()
    loading: tuple[Share[Loading], ...] = ()
    workers: tuple[Share[Loading], ...] = ()
    wait: tuple[WaitPart, ...] = ()
    feeder_busy: Figure | None = None  # the workers' feeder threads' busy share
    workers_found: Figure | None = None  # the most alive at once
    dropped: Figure | None = None
    main_cpus: Figure | None = None
    main_thread_cpus: Figure | None = None  # its loop's thread
    main_uss_growth: Figure | None = None
    main_read: Figure | None = None  # bytes/s
    main_cpus_each_s: Figure | None = None
    workers_cpus: Figure | None = None
    workers_runq: Figure | None = None  # CPUs waiting for a CPU
    workers_blocked: Figure | None = None  # share of their time alive
    worker_uss_growth: Figure | None = None  # the most one grew
    workers_read: Figure | None = None  # bytes/s
    not_taken: Figure | None = None  # samples py-spy did not take
    behind: Figure | None = None  # s
    workers_not_sampled: Figure | None = None

    def who(self) -> Who:
        return {"rank": self.rank, "pid": self.pid}  # type: ignore[dict-item]

    def has_block(self) -> bool:
        """Whether it has figures written among its rank's (not only its sampling's)."""
        own = any(getattr(self, f) is not None for f in RANK_FIGURES if f not in SAMPLED)
        return own or bool(self.main or self.loading or self.workers or self.wait)

    def metrics(self) -> Iterator[Metric]:
        """Its figures in the order the stage writes them, but its sampling's."""
        lab = self.who()
        yield from _figures(self, RANK_FIGURES, lab, ("samples",))
        groups: tuple[tuple[str, Sequence[Share[Main]] | Sequence[Share[Loading]]], ...] = (
            (MAIN_SHARE, self.main), (MAIN_LOADING_SHARE, self.loading),
            (WORKER_SHARE, self.workers),
        )  # fmt: skip
        for quantity, shares in groups:
            yield from (s.metric(quantity, lab) for s in shares)
        yield from (p.metric(lab) for p in self.wait)
        rest = [f for f in RANK_FIGURES if f != "samples" and f not in SAMPLED]
        yield from _figures(self, RANK_FIGURES, lab, rest)

    def sampled(self) -> Iterator[Metric]:
        """Its sampling's figures (samples not taken, how far behind, workers not
        sampled), written after the machine's."""
        yield from _figures(self, RANK_FIGURES, self.who(), SAMPLED)


@dataclass(frozen=True)
class Machine:
    """The machine over the window (MACHINE_FIGURES): the other processes' CPUs (on
    average, and each second), the load average, its CPUs, the cgroup's throttling,
    /dev/shm."""

    others_cpus: Figure | None = None
    load_average: Figure | None = None
    machine_cpus: Figure | None = None
    nr_periods: Figure | None = None
    nr_throttled: Figure | None = None
    throttled_s: Figure | None = None
    shm_used_bytes: Figure | None = None
    shm_growth_bytes: Figure | None = None
    others_cpus_each_s: Figure | None = None

    def metrics(self) -> Iterator[Metric]:
        return _figures(self, MACHINE_FIGURES, {}, tuple(MACHINE_FIGURES))


@dataclass(frozen=True)
class Sampler:
    """What attach's own sampling did and took (SAMPLER_FIGURES): its rate (and the
    first where it was restarted), py-spy's CPUs and CPU seconds, the budget, its CPUs
    past its start-up."""

    rate: Figure | None = None
    rate_first: Figure | None = None
    cpus: Figure | None = None
    cpu_seconds: Figure | None = None
    budget_cpus: Figure | None = None
    steady_cpus: Figure | None = None

    def metrics(self) -> Iterator[Metric]:
        return _figures(self, SAMPLER_FIGURES, {}, tuple(SAMPLER_FIGURES))


@dataclass(frozen=True)
class GpuUse:
    """A GPU of the job's: its utilization each second (NVML, %)."""

    index: int
    utilization: Figure

    def metric(self) -> Metric:
        labels: Labels = {"gpu": self.index, "quantity": GPU_UTILIZATION}
        return self.utilization.metric("attach.gpu.utilization", "%", labels)


@dataclass(frozen=True)
class AttachFigures:
    """Every figure of an attach run: each rank's, in the order read (`ranks`); the
    machine's over the window; each GPU's utilization; attach's own sampling's. `machine_first`: the
    machine's figures before the ranks' (a report built so, tests/golden's), rather
    than after them, where the stage writes them."""

    ranks: tuple[RankFigures, ...] = ()
    machine: Machine = field(default_factory=Machine)
    gpus: tuple[GpuUse, ...] = ()
    sampler: Sampler = field(default_factory=Sampler)
    machine_first: bool = False

    def rank(self, pid: int) -> RankFigures:
        """The rank `pid`'s figures (none where the run has none of it)."""
        return next((r for r in self.ranks if r.pid == pid), RankFigures(pid))

    def to_metrics(self) -> tuple[Metric, ...]:
        """The labelled metrics the JSON carries, in the order the stage writes them."""
        machine = list(self.machine.metrics())
        return (
            *(machine if self.machine_first else []),
            *(m for r in self.ranks for m in r.metrics()),
            *([] if self.machine_first else machine),
            *(g.metric() for g in self.gpus),
            *self.sampler.metrics(),
            *(m for r in self.ranks for m in r.sampled()),
        )

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> AttachFigures:
        """The figures a result holds (other stages' metrics, and any this cannot read,
        left out)."""
        reader = _Reader()
        for m in metrics:
            reader.take(m)
        return reader.figures()

    @staticmethod
    def is_share(m: Metric) -> bool:
        """Whether a metric is a share with a value that the record reads (what the
        table of shares takes, render/attach.py)."""
        return m.value is not None and read_share(m) is not None


RANK_OF = {quantity: name for name, (quantity, _, _) in RANK_FIGURES.items()}
MACHINE_OF = {quantity: name for name, (quantity, _, _) in MACHINE_FIGURES.items()}
SAMPLER_OF = {quantity: name for name, (quantity, _, _) in SAMPLER_FIGURES.items()}


class _Reader:
    """Metrics into an AttachFigures, by labels (the module says how)."""

    def __init__(self) -> None:
        self.ranks: dict[int, dict[str, object]] = {}
        self.block: list[int] = []  # the ranks in the order their own figures come
        self.sampling: list[int] = []  # ... their sampling's
        self.machine: dict[str, Figure] = {}
        self.sampler: dict[str, Figure] = {}
        self.gpus: list[GpuUse] = []
        self.machine_first = False

    def take(self, m: Metric) -> None:
        figure, labels = Figure.of(m), labels_of(m)
        quantity = labels.get("quantity")
        if figure is None or not isinstance(quantity, str):
            return
        share = read_share(m)
        who = who_of(labels)
        if share is not None and who is not None:
            rank = self._rank(who, self.block)
            rank[share[0]] = (*rank.get(share[0], ()), share[1])  # type: ignore[misc]
        elif quantity in RANK_OF and who is not None:
            name = RANK_OF[quantity]
            rank = self._rank(who, self.sampling if name in SAMPLED else self.block)
            rank.setdefault(name, figure)
        elif quantity in MACHINE_OF:
            self.machine.setdefault(MACHINE_OF[quantity], figure)
            self.machine_first = self.machine_first or not self.block
        elif quantity in SAMPLER_OF:
            self.sampler.setdefault(SAMPLER_OF[quantity], figure)
        elif quantity == GPU_UTILIZATION and (gpu := whole(labels.get("gpu"))) is not None:
            self.gpus.append(GpuUse(gpu, figure))

    def _rank(self, who: tuple[int, int | None], order: list[int]) -> dict[str, object]:
        pid, rank = who
        if pid not in order:
            order.append(pid)
        return self.ranks.setdefault(pid, {"pid": pid, "rank": rank})

    def figures(self) -> AttachFigures:
        order = _merged(self.block, self.sampling)
        ranks = tuple(RankFigures(**self.ranks[p]) for p in order)  # type: ignore[arg-type]
        return AttachFigures(
            ranks,
            Machine(**self.machine),
            tuple(self.gpus),
            Sampler(**self.sampler),
            self.machine_first and bool(ranks),
        )


def _merged(first: list[int], then: list[int]) -> list[int]:
    """The ranks in one order that keeps both: each of `then`'s not in `first` placed
    before the next of `then`'s that is."""
    out = list(first)
    pending: list[int] = []
    for pid in then:
        if pid not in first:
            pending.append(pid)
        elif pending:
            at = out.index(pid)
            out[at:at] = pending
            pending = []
    return out + pending
