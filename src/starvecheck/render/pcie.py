"""Metrics of a `pcie` run as three tables: the size sweep, the overlap experiment,
and the link (idle, under load, maximum), plus NUMA when measured.

The JSON keeps one flat metric per figure (`h2d.pinned.256MiB`, `.events`,
`overlap.pinned.non_blocking`, `link.gen_under_load`, ...); people compare sizes
and memories side by side, so the terminal and Markdown pivot them. A table whose
figures are all missing for one reason (no CUDA device) becomes one line. The
overlap verdicts and the links' theoretical peaks are advice/pcie's, read from what
judging stored beside the figures (`StageResult.judged.verdicts`); "-" where it did not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from starvecheck.core.metric import LabelValue, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.common import SOURCE_CUDART
from starvecheck.core.schema.pcie import Parameters
from starvecheck.core.units import format_bytes, parse_size, size_name
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


def _gbps(m: Metric | None) -> str:
    if m is None:
        return "-"
    if m.value is None:
        return "n/a"
    return f"{m.value:,.2f}" if m.value < 100 else f"{m.value:,.0f}"


def _range(m: Metric | None) -> str:
    if m is None or m.value is None or not m.values:
        return ""
    return f"{m.min:,.2f} … {m.max:,.2f}"


def _collapsed(metrics: Sequence[Metric]) -> str | None:
    """The one reason shared by every metric, when all are missing for it."""
    reasons = {m.reason for m in metrics}
    if metrics and all(m.value is None for m in metrics) and len(reasons) == 1:
        return next(iter(reasons)) or "not measured"
    return None


def _size_key(size: str) -> int:
    return parse_size(size) or 0


def split(
    metrics: Sequence[Metric],
    params: Parameters,
    judged: Mapping[str, LabelValue | None] | None = None,
) -> tuple[list[Table], list[Metric], list[str]]:
    """(tables, other metrics, notes); nothing unless the metrics are a pcie run's.
    `judged`: what judging read off them (advice/pcie.complete)."""
    params = Parameters.of(params)
    judged = judged or {}
    sweep: dict[tuple[str, str, str, str], dict[str, Metric]] = {}
    overlaps: dict[tuple[str, str], dict[str, Metric]] = {}
    link: dict[str, Metric] = {}
    numa: dict[str, Metric] = {}
    groups: dict[str, list[Metric]] = {"sweep": [], "overlap": [], "link": [], "numa": []}
    rest: list[Metric] = []
    ratio: Metric | None = None
    for m in metrics:
        labels = m.labels
        q, group = str(labels.get("quantity", "")), labels.get("group")
        if q == "gbps" and group is None and "direction" in labels:
            cudart = labels.get("source") == SOURCE_CUDART
            memory = str(labels["memory"]) + (", CUDA runtime" if cudart else "")
            if labels.get("variant") == "fresh":
                memory += ", fresh buffer"
            size = size_name(int(labels["size"]))
            key = (str(labels["direction"]), memory, size, "ref" if cudart else "")
            sweep.setdefault(key, {})[str(labels.get("clock", "wall"))] = m
            groups["sweep"].append(m)
        elif q.startswith("overlap") and "mode" in labels:
            part = q[len("overlap") :].lstrip("_") or "ratio"
            overlaps.setdefault((str(labels["memory"]), str(labels["mode"])), {})[part] = m
            groups["overlap"].append(m)
        elif q == "reference_ratio":
            groups["sweep"].append(m)
            ratio = m
        elif group == "link":
            link[f"link.{q}"] = m
            groups["link"].append(m)
        elif group == "numa":
            where = "remote_penalty" if q == "remote_penalty" else f"h2d.pinned.{labels['node']}"
            numa[f"numa.{where}"] = m
            groups["numa"].append(m)
        else:
            rest.append(m)
    if not any(groups.values()):
        return [], list(metrics), []
    tables: list[Table] = []
    notes: list[str] = []
    present = [g for g in groups.values() if g]
    whole = _collapsed([m for g in present for m in g])
    if whole is not None:  # no device: one line, not one per table
        return [], rest, [whole, *_host_notes(params)]
    steps = (
        lambda: _sweep_table(sweep, groups["sweep"], ratio, params, tables, notes),
        lambda: _overlap_table(overlaps, groups["overlap"], judged, tables, notes),
        lambda: _link_table(link, groups["link"], params, judged, tables, notes),
        lambda: _numa_table(numa, params, tables, notes),
    )
    for step in steps:
        before_tables, before_notes = len(tables), len(notes)
        step()
        if len(tables) > before_tables:  # the step's notes go under its table
            tables[-1].notes.extend(notes[before_notes:])
            del notes[before_notes:]
    notes += _host_notes(params)
    return tables, rest, notes


def _sweep_table(
    sweep: dict,
    group: list[Metric],
    ratio: Metric | None,
    params: Parameters,
    tables: list[Table],
    notes: list[str],
) -> None:
    if not group:
        return
    if (why := _collapsed(group)) is not None:
        notes.append(f"size sweep: {why}")
        return
    order = {"h2d": 0, "d2h": 1}
    memories = {
        "pinned": 0,
        "pageable": 1,
        "pageable, fresh buffer": 2,
        "pinned, CUDA runtime": 3,
    }
    rows = []
    for (d, memory, size, _ref), cells in sorted(
        sweep.items(),
        key=lambda kv: (order[kv[0][0]], _size_key(kv[0][2]), memories.get(kv[0][1], 9)),
    ):
        wall = cells.get("wall")
        rows.append(
            (
                d.upper(),
                memory,
                size,
                _gbps(wall),
                _range(wall),
                _gbps(cells.get("events")),
                str(wall.n) if wall is not None and wall.values else "",
            )
        )
    tables.append(Table("size sweep", SWEEP_HEADERS, rows, 3))
    for m in group:
        if m.value is None and m.reason and m is not ratio:
            notes.append(f"{m.name}: {m.reason}")
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


def _ms(m: Metric | None) -> str:
    return "-" if m is None or m.value is None else f"{m.value:,.2f}"


def _overlap_table(
    overlaps: dict,
    group: list[Metric],
    judged: Mapping[str, LabelValue | None],
    tables: list[Table],
    notes: list[str],
) -> None:
    if not group:
        return
    if (why := _collapsed(group)) is not None:
        notes.append(f"overlap: {why}")
        return
    rows = []
    unknown: dict[str, list[str]] = {}
    for mem in ("pageable", "pinned"):
        for mode in ("blocking", "non_blocking"):
            c = overlaps.get((mem, mode), {})
            ratio = c.get("ratio")
            cpu, copy = c.get("cpu_ms"), c.get("copy_ms")
            seq = (
                f"{cpu.value + copy.value:,.2f}"
                if cpu is not None and copy is not None and None not in (cpu.value, copy.value)
                else "-"
            )
            value = ratio.value if ratio is not None else None
            rows.append(
                (
                    mem,
                    mode,
                    _ms(copy),
                    _ms(cpu),
                    seq,
                    _ms(c.get("both_ms")),
                    "n/a" if value is None else f"{value:.0%}",
                    str(judged.get(f"overlap_verdict.{mem}.{mode}", "-")),
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


def _num(m: Metric | None) -> str:
    return "?" if m is None or m.value is None else f"{m.value:g}"


def _link_table(
    link: dict[str, Metric],
    group: list[Metric],
    params: Parameters,
    judged: Mapping[str, LabelValue | None],
    tables: list[Table],
    notes: list[str],
) -> None:
    if not group:
        return
    if (why := _collapsed(group)) is not None:
        notes.append(f"link under load: {why}")
        return

    def peak(row: str) -> str:
        p = judged.get(f"link_peak_gbps.{row}")
        return "-" if p is None else f"{p:.1f}"

    eff = link.get("link.efficiency")
    rows = [
        ("idle (at start)", _num(link.get("link.gen_idle")), _num(link.get("link.width_idle")),
         peak("idle"), "", ""),
        ("under load", _num(link.get("link.gen_under_load")),
         _num(link.get("link.width_under_load")), peak("under_load"),
         _gbps(link.get("link.h2d_under_load")),
         "n/a" if eff is None or eff.value is None else f"{eff.value:.0%}"),
        ("maximum", _num(link.get("link.gen_max")), _num(link.get("link.width_max")),
         peak("max"), "", ""),
    ]  # fmt: skip
    tables.append(Table("link", LINK_HEADERS, rows, 1))
    for m in group:
        if m.value is None and m.reason:
            notes.append(f"{m.name}: {m.reason}")
    rx, tx = link.get("link.nvml_rx_gbps"), link.get("link.nvml_tx_gbps")
    if rx is not None and rx.value is not None:
        notes.append(
            f"NVML PCIe counters while loaded (median, 20 ms windows): RX {rx.value:.1f} GB/s, "
            f"TX {_gbps(tx)} GB/s; {_or_unknown(params.link_samples)} samples"
        )


def _numa_table(
    numa: dict[str, Metric], params: Parameters, tables: list[Table], notes: list[str]
) -> None:
    if not numa:
        return
    rows = []
    for where in ("local", "remote"):
        m = numa.get(f"numa.h2d.pinned.{where}")
        node = params.numa_local_node if where == "local" else params.numa_remote_node
        label = f"node {node} ({'the GPU' if where == 'local' else 'another'}'s)"
        rows.append((label, _gbps(m), _range(m), str(m.n) if m and m.values else ""))
        if m is not None and m.value is None and m.reason:
            notes.append(f"NUMA {where}: {m.reason}")
    tables.append(Table("pinned H2D by NUMA node", NUMA_HEADERS, rows, 1))
    pen = numa.get("numa.remote_penalty")
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
    tables, rest, notes = split(metrics, stage.parameters.read(Parameters), stage.judged.verdicts)
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
