"""Machine facts as lines a person reads; shared by the terminal and Markdown renderers.

Reads the JSON-ready machine dict (Report.machine), so a stored report renders
exactly as a fresh one. Unknown values say "unknown"; the reasons are listed by
`unknown_rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starvecheck.core import stages as stages_table
from starvecheck.core.units import format_bytes


def _get(d: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _or(value: Any, text: str | None = None, missing: str = "unknown") -> str:
    return missing if value is None else (text if text is not None else str(value))


def _bytes(m: Mapping[str, Any], key: str, absent: str = "none") -> str:
    """A size, or `absent` when it does not apply here (no limit), or "unknown"."""
    value = _get(m, key)
    if value is None:
        return absent if key in m.get("not_applicable", {}) else "unknown"
    return format_bytes(value)


def shows_gpus(command: str) -> bool:
    """Whether the command's report shows the GPU rows: those that show every fact (the
    stage table's `facts`, core/stages.py)."""
    return stages_table.entry(command).facts is None


def machine_rows(m: Mapping[str, Any], command: str | None = None) -> list[tuple[str, str]]:
    rows = [(name, text(m)) for name, text in _ROWS]
    # The facts each command's report shows (all of them go to JSON): the stage table's.
    shown = stages_table.entry(command or "").facts
    return [r for r in rows if r[0] in shown] if shown is not None else rows


def _cpu(m: Mapping[str, Any]) -> str:
    na = m.get("not_applicable", {})
    cpu = m.get("cpu", {})
    quota = cpu.get("quota_cpus")
    quota_text = (
        f"{quota:g} CPUs"
        if quota is not None
        else ("none" if "cpu.quota_cpus" in na else "unknown")
    )
    affinity = (
        f"{cpu['affinity']} ({cpu['affinity_list']})"
        if cpu.get("affinity") is not None
        else "unknown"
    )
    return (
        f"{_or(cpu.get('model'))} · {_or(cpu.get('logical'))} logical, "
        f"{_or(cpu.get('physical'))} physical · affinity {affinity} · quota {quota_text} · "
        f"effective {_or(cpu.get('effective_cpus'))}"
    )


def _cgroup(m: Mapping[str, Any]) -> str:
    cg = m.get("cgroup", {})
    if cg.get("version") is None:
        return "none" if "cgroup.version" in m.get("not_applicable", {}) else "unknown"
    text = f"v{cg['version']}" + (" (hybrid)" if cg.get("mode") == "hybrid" else "")
    t = cg.get("throttling")
    if t and t["nr_periods"]:  # no periods: no quota has ever applied
        text += (
            f" · throttled in {t['nr_throttled']:,} of {t['nr_periods']:,} periods "
            f"({t['share']:.1%}, {t['throttled_s']:,.0f} s)"
        )
    if cg.get("quota_path"):
        text += f" · quota set at {cg['quota_path']}"
    return text


def _memory(m: Mapping[str, Any]) -> str:
    mem = m.get("memory", {})
    return (
        f"{_bytes(m, 'memory.total_bytes')} total, {_bytes(m, 'memory.available_bytes')} "
        f"available · cgroup limit {_bytes(m, 'memory.limit_bytes')}"
        + (f" ({format_bytes(mem['usage_bytes'])} used)" if mem.get("usage_bytes") else "")
        + f" · swap {_bytes(m, 'memory.swap_total_bytes')}"
    )


def _shm(m: Mapping[str, Any]) -> str:
    shm = m.get("shm", {})
    if not shm.get("mounted"):
        return "not mounted"
    free = f" ({format_bytes(shm['free_bytes'])} free)" if shm.get("free_bytes") is not None else ""
    return f"{shm.get('fstype')}, {_bytes(m, 'shm.size_bytes')}{free}"


def _limits(m: Mapping[str, Any]) -> str:
    lim = m.get("limits", {})
    nofile = f"{lim['nofile']:,}" if lim.get("nofile") is not None else "unknown"
    nofile_hard = f"{lim['nofile_hard']:,}" if lim.get("nofile_hard") is not None else "unknown"
    memlock = _bytes(m, "limits.memlock_bytes", absent="unlimited")
    pids = lim.get("pids_max")
    pids_text = (
        f"{pids:,}"
        if pids is not None
        else ("unlimited" if "limits.pids_max" in m.get("not_applicable", {}) else "unknown")
    )
    return (
        f"open files {nofile} (hard {nofile_hard}) · locked memory {memlock}"
        f" · tasks (pids.max) {pids_text}"
    )


def _numa(m: Mapping[str, Any]) -> str:
    numa = m.get("numa", {})
    if not numa.get("nodes"):
        return "unknown (no NUMA topology exposed)"
    nodes = "; ".join(
        f"node{n['id']}: CPUs {n['cpus'] or '-'}, {format_bytes(n['memory_bytes'])}"
        for n in numa.get("node_list", [])
    )
    return f"{numa['nodes']} node{'s' if numa['nodes'] > 1 else ''}: {nodes}"


def _gpus(m: Mapping[str, Any]) -> str:
    gpus = m.get("gpus", [])
    drv = m.get("gpu_driver", {})
    if not gpus:
        return "none"
    names: dict[str, int] = {}
    for g in gpus:
        names[g.get("name") or "NVIDIA GPU (name unknown)"] = (
            names.get(g.get("name") or "NVIDIA GPU (name unknown)", 0) + 1
        )
    text = ", ".join(f"{n} x {name}" for name, n in names.items())
    text += (
        f" · driver {_or(drv.get('driver_version'))} · CUDA {_or(drv.get('cuda_driver_version'))}"
    )
    if drv.get("nvml") != "ok":
        text += f" · NVML: {drv.get('nvml')}"
    return text


def _container(m: Mapping[str, Any]) -> str:
    cont = m.get("container", {})
    runtime = cont.get("runtime") or "none (bare metal or VM)"
    k8s = "yes" if cont.get("kubernetes") else "no"
    return f"{runtime} · Kubernetes: {k8s}"


def _storage(m: Mapping[str, Any]) -> str:
    st = m.get("storage", {})
    if not st.get("fstype"):
        return f"{st.get('path')}: unknown"
    rot = {True: "rotational", False: "non-rotational", None: ""}[st.get("rotational")]
    kind = st.get("kind")
    where = "network" if kind == "network" else ("FUSE" if kind == "fuse" else kind)
    detail = ", ".join(x for x in (where, rot) if x)
    free = f" · {format_bytes(st['free_bytes'])} free" if st.get("free_bytes") is not None else ""
    return (
        f"{st['path']} on {st.get('mount_point')} · {st['fstype']} "
        f"({st.get('source')}) · {detail}{free}"
    )


def _software(m: Mapping[str, Any]) -> str:
    sw = m.get("software", {})
    torch = sw.get("torch")
    torch_text = (
        "not installed"
        if torch is None
        else (
            f"{torch} (CUDA {sw['torch_cuda']})" if sw.get("torch_cuda") else f"{torch} (CPU build)"
        )
    )
    return (
        ("" if m.get("real", True) else "this Python, not the fake machine's: ")
        + f"Python {sw.get('python')} · torch {torch_text} · transformers "
        f"{_or(sw.get('transformers'), missing='-')} · mosaicml-streaming "
        f"{_or(sw.get('streaming'), missing='-')}"
    )


# One row per fact, in the table's order: (its name, its text out of the machine dict).
_ROWS: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
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


def _link(gen: Any, width: Any) -> str:
    if gen is None and width is None:
        return "unknown"
    return f"gen{_or(gen, missing='?')} x{_or(width, missing='?')}"


def gpu_rows(m: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for g in m.get("gpus", []):
        p = g.get("pcie", {})
        util = g.get("utilization_pct")
        rows.append(
            (
                str(g.get("index")),
                g.get("name") or "unknown",
                g.get("pci_bus_id") or "unknown",
                format_bytes(g["memory_total_bytes"]) if g.get("memory_total_bytes") else "unknown",
                _link(p.get("gen_current"), p.get("width_current")),
                _link(p.get("gen_max"), p.get("width_max")),
                f"{p['theoretical_gbps_max']:.1f}" if p.get("theoretical_gbps_max") else "-",
                _or(g.get("numa_node"), missing="-"),
                f"{util}%" if util is not None else "-",
            )
        )
    return rows


def unknown_rows(m: Mapping[str, Any], command: str | None = None) -> list[tuple[str, str]]:
    prefixes = stages_table.entry(command or "").unknown_facts
    return sorted(
        (k, v)
        for k, v in m.get("unknown", {}).items()
        if prefixes is None or k.startswith(prefixes)
    )
