"""pcie's words: its parameters, its label values (enums) and its figures as records
(`PcieFigures`). Judging's verdicts on them are core/schema/pcie_verdicts.py's; the
labels of a schema-1 name, core/schema/pcie_schema1.py's.

The stage fills a `PcieFigures` once; the JSON is its serialisation: `to_metrics()`
writes the labelled metrics of schema 2 and 3 (names, labels, units, values, order),
`from_metrics()` reads them back by their labels, from a fresh result or a stored
report alike (`StageResult.records`), never raising: what it cannot read is left out.
The metrics' names are spelled here alone."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from starvecheck.core.compat import StrEnum
from starvecheck.core.metric import Labels, Metric
from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import flag, mapping, text, whole
from starvecheck.core.schema.figure import Figure
from starvecheck.core.units import size_name


class Parameters(Base):
    cuda = flag()  # a CUDA device was present
    reference_size = text()
    host_headroom_bytes = whole()
    host_headroom_source = text()  # what the headroom was read from
    pinned_budget_bytes = whole()
    link_samples = whole()  # NVML samples of the link under load
    memlock_unlimited = flag()
    memlock_bytes = whole()
    sizes_skipped = mapping()
    numa_nodes = whole()
    numa_local_node = whole()
    numa_remote_node = whole()


class Direction(StrEnum):
    H2D = "h2d"
    D2H = "d2h"


class Memory(StrEnum):
    PINNED = "pinned"
    PAGEABLE = "pageable"


class Mode(StrEnum):
    BLOCKING = "blocking"
    NON_BLOCKING = "non_blocking"


class Clock(StrEnum):
    WALL = "wall"  # around torch.cuda.synchronize(): what a training loop waits for
    EVENTS = "events"  # CUDA events: the device's part alone


class Source(StrEnum):
    TORCH = "torch"
    CUDART = "cudart"  # the CUDA runtime's cudaMemcpy, the reference


class Row(StrEnum):
    """The link as read idle (at start), under load, and at its maximum."""

    IDLE = "idle"
    UNDER_LOAD = "under_load"
    MAX = "max"


GBPS = "gbps"  # the quantity of a bandwidth (capacity reads pinned H2D's)
FRESH = "fresh"  # the `variant` of a D2H copy into a fresh pageable buffer
GROUP_LINK, GROUP_NUMA = "link", "numa"
OVERLAP = "overlap"
REFERENCE_RATIO = "reference_ratio"
REMOTE_PENALTY = "remote_penalty"
LOCAL, REMOTE = "local", "remote"
OVERLAP_PARTS = ("cpu_ms", "copy_ms", "both_ms")


@dataclass(frozen=True)
class Copy:
    """One copy timed: its wall-clock figure and, where timed, its CUDA events'."""

    direction: Direction
    memory: Memory
    size: int  # bytes
    wall: Figure | None = None
    events: Figure | None = None
    source: Source = Source.TORCH
    fresh: bool = False  # D2H into a fresh pageable buffer, as `.to("cpu")` does

    def name(self, clock: Clock = Clock.WALL) -> str:
        parts = [self.direction.value, self.memory.value, size_name(self.size)]
        parts = (["reference"] if self.source is Source.CUDART else []) + parts
        parts += [FRESH] if self.fresh else []
        return ".".join(parts + ([clock.value] if clock is Clock.EVENTS else []))

    def metrics(self) -> Iterator[Metric]:
        for clock, figure in ((Clock.WALL, self.wall), (Clock.EVENTS, self.events)):
            if figure is not None:
                labels = {"quantity": GBPS, "direction": self.direction.value,
                          "memory": self.memory.value, "size": self.size, "clock": clock.value,
                          "source": self.source.value}  # fmt: skip
                labels |= {"variant": FRESH} if self.fresh else {}
                yield figure.metric(self.name(clock), "GB/s", labels)


@dataclass(frozen=True)
class Overlap:
    """CPU work against one kind of copy: the overlap ratio, and the medians of the
    CPU work alone, the copy alone and both (ms)."""

    memory: Memory
    mode: Mode
    ratio: Figure | None = None
    cpu_ms: Figure | None = None
    copy_ms: Figure | None = None
    both_ms: Figure | None = None

    def metrics(self) -> Iterator[Metric]:
        base = f"{OVERLAP}.{self.memory.value}.{self.mode.value}"
        for part in ("", *OVERLAP_PARTS):
            figure = getattr(self, part or "ratio")
            if figure is not None:
                labels = {
                    "quantity": f"{OVERLAP}_{part}" if part else OVERLAP,
                    "memory": self.memory.value,
                    "mode": self.mode.value,
                }
                unit = "ms" if part else "fraction"
                yield figure.metric(f"{base}.{part}" if part else base, unit, labels)


# The link's figures in the order the stage writes them, and their units.
LINK_UNITS = {
    "gen_idle": "gen", "width_idle": "lanes", "gen_under_load": "gen",
    "width_under_load": "lanes", "gen_max": "gen", "width_max": "lanes",
    "theoretical_gbps": "GB/s", "theoretical_gbps_max": "GB/s", "h2d_under_load": "GB/s",
    "efficiency": "fraction", "nvml_rx_gbps": "GB/s", "nvml_tx_gbps": "GB/s",
}  # fmt: skip


@dataclass(frozen=True)
class Link:
    """The PCIe link: generation and width idle (at start), under load and at the
    maximum GPU and slot support (NVML), the theoretical peak of the link under load and
    at its maximum, pinned H2D measured under load and its share of that peak, and
    NVML's throughput counters while loaded."""

    gen_idle: Figure | None = None
    width_idle: Figure | None = None
    gen_under_load: Figure | None = None
    width_under_load: Figure | None = None
    gen_max: Figure | None = None
    width_max: Figure | None = None
    theoretical_gbps: Figure | None = None
    theoretical_gbps_max: Figure | None = None
    h2d_under_load: Figure | None = None
    efficiency: Figure | None = None
    nvml_rx_gbps: Figure | None = None
    nvml_tx_gbps: Figure | None = None

    def row(self, row: Row) -> tuple[Figure | None, Figure | None]:
        """(generation, width) as read idle, under load or at the maximum."""
        return getattr(self, f"gen_{row.value}"), getattr(self, f"width_{row.value}")

    def metrics(self) -> Iterator[Metric]:
        for name, unit in LINK_UNITS.items():
            figure: Figure | None = getattr(self, name)
            if figure is not None:
                labels = {"quantity": name, "group": GROUP_LINK}
                yield figure.metric(f"{GROUP_LINK}.{name}", unit, labels)


@dataclass(frozen=True)
class Numa:
    """Pinned H2D from a thread on the GPU's NUMA node and on another, and the share of
    bandwidth the other loses."""

    local: Figure | None = None
    remote: Figure | None = None
    remote_penalty: Figure | None = None

    def metrics(self) -> Iterator[Metric]:
        for where, figure in ((LOCAL, self.local), (REMOTE, self.remote)):
            if figure is not None:
                labels = {"quantity": GBPS, "group": GROUP_NUMA, "direction": Direction.H2D.value,
                          "memory": Memory.PINNED.value, "node": where}  # fmt: skip
                yield figure.metric(f"{GROUP_NUMA}.h2d.pinned.{where}", "GB/s", labels)
        if self.remote_penalty is not None:
            labels = {"quantity": REMOTE_PENALTY, "group": GROUP_NUMA}
            name = f"{GROUP_NUMA}.{REMOTE_PENALTY}"
            yield self.remote_penalty.metric(name, "fraction", labels)


@dataclass(frozen=True)
class PcieFigures:
    """Every figure of a pcie run. `copies` and `overlaps` in the order measured;
    `ratio_last`: the reference ratio after every other figure, where a report without
    a device lists the names scripts expect (stages/pcie.cpu_side), rather than after
    the copies, where a run on a device measures it."""

    copies: tuple[Copy, ...] = ()
    reference_ratio: Figure | None = None
    overlaps: tuple[Overlap, ...] = ()
    link: Link = field(default_factory=Link)
    numa: Numa = field(default_factory=Numa)
    ratio_last: bool = False

    def __post_init__(self) -> None:
        after = bool(self.overlaps) or self.link != Link() or self.numa != Numa()
        last = self.ratio_last and self.reference_ratio is not None and after
        object.__setattr__(self, "ratio_last", last)

    def sizes(self, direction: Direction, memory: Memory) -> list[int]:
        """The sizes torch's copies were timed at by the wall clock, this direction and
        memory, not into a fresh buffer."""
        return [
            c.size
            for c in self.copies
            if (c.direction, c.memory, c.source, c.fresh)
            == (direction, memory, Source.TORCH, False)
            and c.wall is not None
            and c.wall.value is not None
        ]

    def copy(
        self, direction: Direction, memory: Memory, size: int, fresh: bool = False
    ) -> Copy | None:
        """torch's copy of this kind, None where not in the run."""
        want = Copy(direction, memory, size, fresh=fresh)
        return next((c for c in self.copies if _kind(c) == want), None)

    def overlap(self, memory: Memory, mode: Mode) -> Overlap:
        """The overlap of this memory and mode (an empty one where not measured)."""
        return next(
            (o for o in self.overlaps if (o.memory, o.mode) == (memory, mode)),
            Overlap(memory, mode),
        )

    def to_metrics(self) -> tuple[Metric, ...]:
        """The labelled metrics the JSON carries, in the order the stage writes them."""
        ratio = (
            []
            if self.reference_ratio is None
            else [
                self.reference_ratio.metric(REFERENCE_RATIO, "ratio", {"quantity": REFERENCE_RATIO})
            ]
        )
        return (
            *(m for c in self.copies for m in c.metrics()),
            *([] if self.ratio_last else ratio),
            *(m for o in self.overlaps for m in o.metrics()),
            *self.link.metrics(),
            *self.numa.metrics(),
            *(ratio if self.ratio_last else []),
        )

    @classmethod
    def from_metrics(cls, metrics: Iterable[Metric]) -> PcieFigures:
        """The figures a result holds (other stages' metrics, and any this cannot read,
        left out)."""
        return _Reader().read(metrics)

    @staticmethod
    def holds(m: Metric) -> bool:
        """Whether a metric is one of pcie's figures (what a table of them takes)."""
        return _Reader().take(m)


def _kind(c: Copy) -> Copy:
    """The copy without its figures: what kind of copy it is."""
    return replace(c, wall=None, events=None)


class _Reader:
    """Metrics into a PcieFigures, by labels: a copy's events figure joins the wall
    clock's just before it; an overlap's parts join its ratio."""

    def __init__(self) -> None:
        self.copies: list[Copy] = []
        self.overlaps: dict[tuple[Memory, Mode], Overlap] = {}
        self.link: dict[str, Figure] = {}
        self.numa: dict[str, Figure] = {}
        self.ratio: Figure | None = None
        self.ratio_last = False
        self.other_seen = False

    def read(self, metrics: Iterable[Metric]) -> PcieFigures:
        for m in metrics:
            self.take(m)
        overlaps = tuple(self.overlaps.values())
        link, numa = Link(**self.link), Numa(**self.numa)
        return PcieFigures(tuple(self.copies), self.ratio, overlaps, link, numa, self.ratio_last)

    def take(self, m: Metric) -> bool:
        figure = Figure.of(m)
        labels = m.labels if isinstance(m.labels, Mapping) else {}
        if figure is None:
            return False
        quantity, group = labels.get("quantity"), labels.get("group")
        if group == GROUP_LINK and isinstance(quantity, str) and quantity in LINK_UNITS:
            self.link[quantity], self.other_seen = figure, True
        elif group == GROUP_NUMA:
            return self._numa(labels, figure)
        elif quantity == GBPS and group is None:
            return self._copy(labels, figure)
        elif isinstance(quantity, str) and quantity.startswith(OVERLAP) and "mode" in labels:
            return self._overlap(labels, quantity, figure)
        elif quantity == REFERENCE_RATIO:
            self.ratio, self.ratio_last = figure, self.other_seen
        else:
            return False
        return True

    def _numa(self, labels: Labels, figure: Figure) -> bool:
        where = labels.get("node") if labels.get("quantity") == GBPS else REMOTE_PENALTY
        if where not in (LOCAL, REMOTE, REMOTE_PENALTY):
            return False
        self.numa[str(where)], self.other_seen = figure, True
        return True

    def _copy(self, labels: Labels, figure: Figure) -> bool:
        size, variant = labels.get("size"), labels.get("variant")
        try:
            kind = (
                Direction(str(labels.get("direction"))),
                Memory(str(labels.get("memory"))),
                Source(str(labels.get("source", Source.TORCH.value))),
                Clock(str(labels.get("clock", Clock.WALL.value))),
            )
        except ValueError:
            return False
        if not isinstance(size, int) or isinstance(size, bool) or variant not in (None, FRESH):
            return False
        direction, memory, source, clock = kind
        made = Copy(direction, memory, size, source=source, fresh=variant == FRESH)
        last = self.copies[-1] if self.copies else None
        if (
            clock is Clock.EVENTS
            and last is not None
            and last.events is None
            and _kind(last) == made
        ):
            self.copies[-1] = replace(last, events=figure)
        else:
            events = clock is Clock.EVENTS
            made = replace(made, events=figure) if events else replace(made, wall=figure)
            self.copies.append(made)
        return True

    def _overlap(self, labels: Labels, quantity: str, figure: Figure) -> bool:
        part = quantity[len(OVERLAP) :].lstrip("_") or "ratio"
        try:
            key = (Memory(str(labels.get("memory"))), Mode(str(labels.get("mode"))))
        except ValueError:
            return False
        if part not in ("ratio", *OVERLAP_PARTS):
            return False
        was = self.overlaps.get(key, Overlap(*key))
        held = {p: getattr(was, p) for p in ("ratio", *OVERLAP_PARTS)} | {part: figure}
        self.overlaps[key] = Overlap(*key, held["ratio"], *(held[p] for p in OVERLAP_PARTS))
        self.other_seen = True
        return True
