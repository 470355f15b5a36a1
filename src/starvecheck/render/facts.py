"""Machine facts as lines a person reads; shared by the terminal and Markdown renderers.

Reads the machine record (core/schema/machine.Machine) a report carries
(`Report.facts`, read from its JSON), by field, so a stored report renders exactly as a
fresh one. Unknown values say "unknown"; the reasons are listed under the table.
`sections(report)` is the one entry: the facts, the GPUs, the unknown facts.
"""

from __future__ import annotations

from collections.abc import Callable

from starvecheck.core import stages as stages_table
from starvecheck.core.report import Report
from starvecheck.core.schema.machine import (
    Cgroup,
    GpuInfo,
    Limits,
    Machine,
    Memory,
    Numa,
    Shm,
    Software,
    Storage,
)
from starvecheck.core.units import format_bytes
from starvecheck.render.section import Section

MACHINE, GPUS, UNKNOWN = "Machine", "GPUs", "Unknown (could not be read):"
GPU_HEADERS = (
    "GPU",
    "name",
    "bus id",
    "memory",
    "PCIe now",
    "PCIe max",
    "max GB/s",
    "NUMA",
    "util",
)


def sections(report: Report) -> list[Section]:
    """What the report shows of its machine: the facts its command shows (a section
    titled MACHINE, first, its rows (label, text); none where the report carries no
    facts), then the GPUs (GPUS, where the command shows them and there are any) and
    the unknown facts worth listing (UNKNOWN: notes "key: reason", where any)."""
    if not report.machine:
        return []
    m, command = report.facts, report.command
    entry = stages_table.entry(command)
    rows: list[tuple[str, ...]] = [(name, text(m)) for name, text in _ROWS]
    # The facts each command's report shows (all of them go to JSON): the stage table's.
    if entry.facts is not None:
        rows = [r for r in rows if r[0] in entry.facts]
    out = [Section(("", ""), rows, title=MACHINE)]
    # The commands that show every fact show the GPUs.
    gpus = [_gpu_row(g) for g in m.gpus] if entry.facts is None else []
    if gpus:
        out.append(Section(GPU_HEADERS, gpus, title=GPUS))
    prefixes = entry.unknown_facts
    unknown = sorted(
        (k, v) for k, v in m.unknown.items() if prefixes is None or k.startswith(prefixes)
    )
    if unknown:
        out.append(Section((), [], [f"{k}: {v}" for k, v in unknown], title=UNKNOWN))
    return out


def _or(value: float | str | None, text: str | None = None, missing: str = "unknown") -> str:
    return missing if value is None else (text if text is not None else str(value))


def _bytes(m: Machine, key: str, value: int | None, absent: str = "none") -> str:
    """A size, or `absent` when it does not apply here (no limit: `key` is among the
    record's `not_applicable`), or "unknown"."""
    if value is None:
        return absent if key in m.not_applicable else "unknown"
    return format_bytes(value)


def _cpu(m: Machine) -> str:
    cpu = m.cpu
    quota = cpu.quota_cpus
    quota_text = (
        f"{quota:g} CPUs"
        if quota is not None
        else ("none" if "cpu.quota_cpus" in m.not_applicable else "unknown")
    )
    affinity = f"{cpu.affinity} ({cpu.affinity_list})" if cpu.affinity is not None else "unknown"
    return (
        f"{_or(cpu.model)} · {_or(cpu.logical)} logical, "
        f"{_or(cpu.physical)} physical · affinity {affinity} · quota {quota_text} · "
        f"effective {_or(cpu.effective_cpus)}"
    )


def _cgroup(m: Machine) -> str:
    cg: Cgroup = m.cgroup
    if cg.version is None:
        return "none" if "cgroup.version" in m.not_applicable else "unknown"
    text = f"v{cg.version}" + (" (hybrid)" if cg.mode == "hybrid" else "")
    t = cg.throttling
    if t and t.nr_periods:  # no periods: no quota has ever applied
        text += (
            f" · throttled in {t.nr_throttled:,} of {t.nr_periods:,} periods "
            f"({t.share:.1%}, {t.throttled_s:,.0f} s)"
        )
    if cg.quota_path:
        text += f" · quota set at {cg.quota_path}"
    return text


def _memory(m: Machine) -> str:
    mem: Memory = m.memory
    return (
        f"{_bytes(m, 'memory.total_bytes', mem.total_bytes)} total, "
        f"{_bytes(m, 'memory.available_bytes', mem.available_bytes)} "
        f"available · cgroup limit {_bytes(m, 'memory.limit_bytes', mem.limit_bytes)}"
        + (f" ({format_bytes(mem.usage_bytes)} used)" if mem.usage_bytes else "")
        + f" · swap {_bytes(m, 'memory.swap_total_bytes', mem.swap_total_bytes)}"
    )


def _shm(m: Machine) -> str:
    shm: Shm = m.shm
    if not shm.mounted:
        return "not mounted"
    free = f" ({format_bytes(shm.free_bytes)} free)" if shm.free_bytes is not None else ""
    return f"{shm.fstype}, {_bytes(m, 'shm.size_bytes', shm.size_bytes)}{free}"


def _limits(m: Machine) -> str:
    lim: Limits = m.limits
    nofile = f"{lim.nofile:,}" if lim.nofile is not None else "unknown"
    nofile_hard = f"{lim.nofile_hard:,}" if lim.nofile_hard is not None else "unknown"
    memlock = _bytes(m, "limits.memlock_bytes", lim.memlock_bytes, absent="unlimited")
    pids = lim.pids_max
    pids_text = (
        f"{pids:,}"
        if pids is not None
        else ("unlimited" if "limits.pids_max" in m.not_applicable else "unknown")
    )
    return (
        f"open files {nofile} (hard {nofile_hard}) · locked memory {memlock}"
        f" · tasks (pids.max) {pids_text}"
    )


def _numa(m: Machine) -> str:
    numa: Numa = m.numa
    if not numa.nodes:
        return "unknown (no NUMA topology exposed)"
    nodes = "; ".join(
        f"node{n.id}: CPUs {n.cpus or '-'}, {format_bytes(n.memory_bytes)}" for n in numa.node_list
    )
    return f"{numa.nodes} node{'s' if numa.nodes > 1 else ''}: {nodes}"


def _gpus(m: Machine) -> str:
    drv = m.gpu_driver
    if not m.gpus:
        return "none"
    names: dict[str, int] = {}
    for g in m.gpus:
        name = g.name or "NVIDIA GPU (name unknown)"
        names[name] = names.get(name, 0) + 1
    text = ", ".join(f"{n} x {name}" for name, n in names.items())
    text += f" · driver {_or(drv.driver_version)} · CUDA {_or(drv.cuda_driver_version)}"
    if drv.nvml != "ok":
        text += f" · NVML: {drv.nvml}"
    return text


def _container(m: Machine) -> str:
    runtime = m.container.runtime or "none (bare metal or VM)"
    return f"{runtime} · Kubernetes: {'yes' if m.container.kubernetes else 'no'}"


def _storage(m: Machine) -> str:
    st: Storage = m.storage
    if not st.fstype:
        return f"{st.path}: unknown"
    rot = {True: "rotational", False: "non-rotational", None: ""}[st.rotational]
    where = "network" if st.kind == "network" else ("FUSE" if st.kind == "fuse" else st.kind)
    detail = ", ".join(x for x in (where, rot) if x)
    free = f" · {format_bytes(st.free_bytes)} free" if st.free_bytes is not None else ""
    return f"{st.path} on {st.mount_point} · {st.fstype} ({st.source}) · {detail}{free}"


def _software(m: Machine) -> str:
    sw: Software = m.software
    torch_text = (
        "not installed"
        if sw.torch is None
        else (f"{sw.torch} (CUDA {sw.torch_cuda})" if sw.torch_cuda else f"{sw.torch} (CPU build)")
    )
    return (
        ("" if m.real else "this Python, not the fake machine's: ")
        + f"Python {sw.python} · torch {torch_text} · transformers "
        f"{_or(sw.transformers, missing='-')} · mosaicml-streaming "
        f"{_or(sw.streaming, missing='-')}"
    )


# One row per fact, in the table's order: (its name, its text out of the machine record).
_ROWS: tuple[tuple[str, Callable[[Machine], str]], ...] = (
    ("CPU", _cpu),
    ("cgroup", _cgroup),
    ("Memory", _memory),
    ("/dev/shm", _shm),
    ("Limits", _limits),
    ("NUMA", _numa),
    ("GPUs", _gpus),
    ("Container", _container),
    ("Storage", _storage),
    ("Software", _software),
)


def _link(gen: int | None, width: int | None) -> str:
    if gen is None and width is None:
        return "unknown"
    return f"gen{_or(gen, missing='?')} x{_or(width, missing='?')}"


def _gpu_row(g: GpuInfo) -> tuple[str, ...]:
    p, util = g.pcie, g.utilization_pct
    return (
        str(g.index),
        g.name or "unknown",
        g.pci_bus_id or "unknown",
        format_bytes(g.memory_total_bytes) if g.memory_total_bytes else "unknown",
        _link(p.gen_current, p.width_current),
        _link(p.gen_max, p.width_max),
        f"{p.theoretical_gbps_max:.1f}" if p.theoretical_gbps_max else "-",
        _or(g.numa_node, missing="-"),
        f"{util}%" if util is not None else "-",
    )
