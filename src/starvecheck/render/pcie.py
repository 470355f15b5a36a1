"""Metrics of a `pcie` run as three tables: the size sweep, the overlap experiment,
and the link (idle, under load, maximum), plus NUMA when measured.

The JSON keeps one flat metric per figure (`h2d.pinned.256MiB`, `.events`,
`overlap.pinned.non_blocking`, `link.gen_under_load`, ...); people compare sizes
and memories side by side, so the terminal and Markdown pivot them. The figures are
read as their record (core/schema/pcie.PcieFigures, `StageResult.records`), by field.
A table whose figures are all missing for one reason (no CUDA device) becomes one
line. The overlap verdicts and the links' theoretical peaks are advice/pcie's, read
from what judging stored beside the figures (`PcieVerdicts`); "-" where it did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.pcie import (
    Copy,
    Direction,
    Link,
    Memory,
    Mode,
    Numa,
    Overlap,
    Parameters,
    PcieFigures,
    Row,
    Source,
)
from starvecheck.core.schema.pcie_verdicts import PcieVerdicts
from starvecheck.core.units import format_bytes, size_name
from starvecheck.render.section import Section, taken

SWEEP_HEADERS = ("direction", "memory", "size", "GB/s", "min … max", "events GB/s", "n")
OVERLAP_HEADERS = ("memory", "mode", "copy ms", "CPU ms", "sequential ms", "together ms",
                   "overlap", "verdict")  # fmt: skip
LINK_HEADERS = ("link", "gen", "width", "peak GB/s", "measured GB/s", "efficiency")
NUMA_HEADERS = ("copying thread", "GB/s", "min … max", "n")


@dataclass(frozen=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]
    numbers_from: int  # the first right-aligned column
    notes: list[str] = field(default_factory=list)  # printed under the table


def _gbps(m: Figure | None) -> str:
    if m is None:
        return "-"
    if m.value is None:
        return "n/a"
    return f"{m.value:,.2f}" if m.value < 100 else f"{m.value:,.0f}"


def _range(m: Figure | None) -> str:
    if m is None or m.value is None or not m.values:
        return ""
    return f"{m.min:,.2f} … {m.max:,.2f}"


def _collapsed(figures: Sequence[Figure]) -> str | None:
    """The one reason shared by every figure, when all are missing for it."""
    reasons = {m.reason for m in figures}
    if figures and all(m.value is None for m in figures) and len(reasons) == 1:
        return next(iter(reasons)) or "not measured"
    return None


def _figures(*parts: Copy | Overlap | Link | Numa) -> list[Figure]:
    """Every figure of these parts of a run, in the order the JSON lists them."""
    return [x for p in parts for x in vars(p).values() if isinstance(x, Figure)]


def _missing(metrics: Sequence[Metric]) -> list[str]:
    """A note for each figure missing with a reason, by its name."""
    return [f"{m.name}: {m.reason}" for m in metrics if m.value is None and m.reason]


def split(
    figures: PcieFigures, params: Parameters, verdicts: PcieVerdicts | None = None
) -> tuple[list[Table], list[str]]:
    """(tables, notes) of a pcie run's figures. `verdicts`: what judging read off
    them (advice/pcie.complete)."""
    params = Parameters.of(params)
    verdicts = verdicts or PcieVerdicts()
    ratio = figures.reference_ratio
    groups = {  # the figures of each table (the reference ratio is shown under the sweep)
        "sweep": [*_figures(*figures.copies), *([] if ratio is None else [ratio])],
        "overlap": _figures(*figures.overlaps),
        "link": _figures(figures.link),
        "numa": _figures(figures.numa),
    }
    tables: list[Table] = []
    notes: list[str] = []
    present = [g for g in groups.values() if g]
    whole = _collapsed([m for g in present for m in g])
    if whole is not None:  # no device: one line, not one per table
        return [], [whole, *_host_notes(params)]
    steps = (
        lambda: _sweep_table(figures, groups["sweep"], params, tables, notes),
        lambda: _overlap_table(figures, groups["overlap"], verdicts, tables, notes),
        lambda: _link_table(figures.link, groups["link"], params, verdicts, tables, notes),
        lambda: _numa_table(figures.numa, params, tables, notes),
    )
    for step in steps:
        before_tables, before_notes = len(tables), len(notes)
        step()
        if len(tables) > before_tables:  # the step's notes go under its table
            tables[-1].notes.extend(notes[before_notes:])
            del notes[before_notes:]
    notes += _host_notes(params)
    return tables, notes


def _sweep_table(
    figures: PcieFigures,
    group: list[Figure],
    params: Parameters,
    tables: list[Table],
    notes: list[str],
) -> None:
    if not group:
        return
    if (why := _collapsed(group)) is not None:
        notes.append(f"size sweep: {why}")
        return
    order = {Direction.H2D: 0, Direction.D2H: 1}
    memories = {
        "pinned": 0,
        "pageable": 1,
        "pageable, fresh buffer": 2,
        "pinned, CUDA runtime": 3,
    }

    def memory(c: Copy) -> str:
        cudart = ", CUDA runtime" if c.source is Source.CUDART else ""
        return f"{c.memory}{cudart}" + (", fresh buffer" if c.fresh else "")

    rows: list[tuple[str, ...]] = [
        (
            c.direction.value.upper(),
            memory(c),
            size_name(c.size),
            _gbps(c.wall),
            _range(c.wall),
            _gbps(c.events),
            str(c.wall.n) if c.wall is not None and c.wall.values else "",
        )
        for c in sorted(
            figures.copies, key=lambda c: (order[c.direction], c.size, memories.get(memory(c), 9))
        )
    ]
    tables.append(Table("size sweep", SWEEP_HEADERS, rows, 3))
    notes += _missing([m for c in figures.copies for m in c.metrics()])
    ratio = figures.reference_ratio
    if ratio is not None:
        size = params.reference_size or "256MiB"
        notes.append(
            f"reference_ratio: {ratio.value:.2f} (torch's pinned H2D at {size} over the CUDA "
            "runtime's cudaMemcpy, medians)"
            if ratio.value is not None
            else f"reference_ratio: n/a ({ratio.reason})"
        )
    notes.append(
        "GB/s: 10^9 bytes/s by the wall clock around torch.cuda.synchronize(), what a "
        "training loop waits for; events GB/s: CUDA events, the device's part alone (a "
        "pageable copy's CPU staging is missing from it)"
    )


def _ms(m: Figure | None) -> str:
    return "-" if m is None or m.value is None else f"{m.value:,.2f}"


def _overlap_table(
    figures: PcieFigures,
    group: list[Figure],
    verdicts: PcieVerdicts,
    tables: list[Table],
    notes: list[str],
) -> None:
    if not group:
        return
    if (why := _collapsed(group)) is not None:
        notes.append(f"overlap: {why}")
        return
    rows: list[tuple[str, ...]] = []
    unknown: dict[str, list[str]] = {}
    for mem in (Memory.PAGEABLE, Memory.PINNED):
        for mode in (Mode.BLOCKING, Mode.NON_BLOCKING):
            o = figures.overlap(mem, mode)
            cpu, copy, ratio = o.cpu_ms, o.copy_ms, o.ratio
            seq = (
                f"{cpu.value + copy.value:,.2f}"
                if cpu is not None
                and copy is not None
                and cpu.value is not None
                and copy.value is not None
                else "-"
            )
            value = ratio.value if ratio is not None else None
            rows.append(
                (
                    mem.value,
                    mode.value,
                    _ms(copy),
                    _ms(cpu),
                    seq,
                    _ms(o.both_ms),
                    "n/a" if value is None else f"{value:.0%}",
                    verdicts.verdict(mem, mode) or "-",
                )
            )
            if ratio is not None and ratio.value is None and ratio.reason:
                unknown.setdefault(ratio.reason, []).append(f"{mem} {mode}")
    notes += [f"overlap {', '.join(which)}: {why}" for why, which in unknown.items()]
    tables.append(Table("overlap", OVERLAP_HEADERS, rows, 2))
    notes.append(
        "overlap = (sequential - together) / (sequential - the longer of the two): "
        "PARALLEL at 80% or more, SEQUENTIAL at 20% or less; medians in ms"
    )


def _num(m: Figure | None) -> str:
    return "?" if m is None or m.value is None else f"{m.value:g}"


def _link_table(
    link: Link,
    group: list[Figure],
    params: Parameters,
    verdicts: PcieVerdicts,
    tables: list[Table],
    notes: list[str],
) -> None:
    if not group:
        return
    if (why := _collapsed(group)) is not None:
        notes.append(f"link under load: {why}")
        return

    def row(name: str, row: Row, measured: str = "", efficiency: str = "") -> tuple[str, ...]:
        gen, width = link.row(row)
        p = verdicts.peak(row)
        return (name, _num(gen), _num(width), "-" if p is None else f"{p:.1f}", measured,
                efficiency)  # fmt: skip

    eff = link.efficiency
    rows = [
        row("idle (at start)", Row.IDLE),
        row("under load", Row.UNDER_LOAD, _gbps(link.h2d_under_load),
            "n/a" if eff is None or eff.value is None else f"{eff.value:.0%}"),
        row("maximum", Row.MAX),
    ]  # fmt: skip
    tables.append(Table("link", LINK_HEADERS, rows, 1))
    notes += _missing(list(link.metrics()))
    rx, tx = link.nvml_rx_gbps, link.nvml_tx_gbps
    if rx is not None and rx.value is not None:
        notes.append(
            f"NVML PCIe counters while loaded (median, 20 ms windows): RX {rx.value:.1f} GB/s, "
            f"TX {_gbps(tx)} GB/s; {_or_unknown(params.link_samples)} samples"
        )


def _numa_table(numa: Numa, params: Parameters, tables: list[Table], notes: list[str]) -> None:
    if numa == Numa():
        return
    rows: list[tuple[str, ...]] = []
    for where, m, node, whose in (
        ("local", numa.local, params.numa_local_node, "the GPU"),
        ("remote", numa.remote, params.numa_remote_node, "another"),
    ):
        label = f"node {node} ({whose}'s)"
        rows.append((label, _gbps(m), _range(m), str(m.n) if m and m.values else ""))
        if m is not None and m.value is None and m.reason:
            notes.append(f"NUMA {where}: {m.reason}")
    tables.append(Table("pinned H2D by NUMA node", NUMA_HEADERS, rows, 1))
    pen = numa.remote_penalty
    if pen is not None and pen.value is not None:
        notes.append(f"remote node penalty: {pen.value:.0%} of the local bandwidth")


def _host_notes(params: Parameters) -> list[str]:
    room = params.host_headroom_bytes
    if params.host_headroom_source is None:
        return []
    memlock = "unlimited" if params.memlock_unlimited else format_bytes(params.memlock_bytes)
    line = (
        f"host memory for pinned buffers: {format_bytes(room)} left "
        f"({params.host_headroom_source}), budget "
        f"{format_bytes(params.pinned_budget_bytes)}; RLIMIT_MEMLOCK {memlock}"
    )
    skipped = params.sizes_skipped
    if skipped:
        line += "; skipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items())
    else:
        line += "; every size fits"
    lines = [line]
    nodes = params.numa_nodes
    if nodes and nodes > 1 and not params.cuda:
        lines.append(
            f"NUMA: {nodes} nodes; with a CUDA device, pinned H2D is measured from a thread "
            "on the GPU's node and from one on another node"
        )
    return lines


def _or_unknown(count: int | None) -> str:
    return "?" if count is None else str(count)


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rest = [m for m in metrics if not PcieFigures.holds(m)]
    if len(rest) == len(metrics):  # not a pcie run's
        return [], list(metrics)
    figures, verdicts = stage.records(PcieFigures), stage.judged.read(PcieVerdicts)
    tables, notes = split(figures, stage.parameters.read(Parameters), verdicts)
    shown = taken(metrics, rest)
    out = [
        # The tables share the figures they were made of: listed under the first.
        Section(
            t.headers,
            t.rows,
            t.notes,
            range(t.numbers_from, len(t.headers)),
            t.title,
            metrics=shown if i == 0 else (),
        )
        for i, t in enumerate(tables)
    ]
    if notes:
        out.append(Section((), [], notes, metrics=() if tables else shown))
    return out, rest
