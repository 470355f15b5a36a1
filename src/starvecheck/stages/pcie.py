"""`pcie`: host <-> device bandwidth, pinned against pageable, CPU/copy overlap, the
link under load, and the NUMA penalty.

Run order on a CUDA device (stages/copies.py does the copies):
  1. the size sweep: H2D and D2H, pinned and pageable (and D2H into a fresh pageable
     buffer, as `.to("cpu")` does), each timed by the wall clock around
     `torch.cuda.synchronize()` (the JSON's plain names: what a training loop feels,
     since its thread waits for the CPU staging of pageable memory too) and by CUDA
     events (`.events`: the device's part alone);
  2. the reference: the same pinned H2D copy through the CUDA runtime by ctypes;
  3. the overlap experiment, pageable/pinned x blocking/non_blocking;
  4. the link under load: NVML polled while pinned copies run back to back;
  5. with more than one NUMA node: pinned H2D from a thread bound to the GPU's node
     and to another node.
Without a device, `cpu_side` reports what the host says: memory headroom for
pinned buffers, RLIMIT_MEMLOCK, NUMA nodes, each GPU's link and its theoretical peak.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starvecheck.model import Metric, StageResult
from starvecheck.probe.machine import Machine
from starvecheck.probe.nvml import normalise_bus_id
from starvecheck.stages import bandwidth as bw
from starvecheck.status import Unavailable

Progress = Callable[[str, int, int], None]
DIRECTIONS = ("h2d", "d2h")
MEMORIES = ("pinned", "pageable")
MODES = ("blocking", "non_blocking")


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]  # bytes
    runs: int
    warmup: int
    quick: bool
    load_s: float = 1.0  # how long the link is kept busy while NVML is polled

    @classmethod
    def default(cls, quick: bool) -> Plan:
        if quick:
            return cls(bw.QUICK_SIZES, runs=5, warmup=2, quick=True, load_s=0.3)
        return cls(bw.DEFAULT_SIZES, runs=10, warmup=3, quick=False, load_s=1.0)

    def parameters(self) -> dict[str, Any]:
        return {
            "sizes": [bw.size_name(s) for s in self.sizes],
            "runs": self.runs,
            "warmup": self.warmup,
            "quick": self.quick,
            "load_s": self.load_s,
        }


def cuda_unavailable() -> str | None:
    """None when a CUDA device can be used, else why not, in one line."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not installed ({e})"
    version = getattr(torch, "__version__", "?")
    if getattr(torch.version, "cuda", None) is None and getattr(torch.version, "hip", None) is None:
        return f"torch {version} is a CPU-only build (no CUDA)"
    try:
        if torch.cuda.device_count() == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            hint = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
            return f"no CUDA device is visible to torch {version} (device_count() is 0{hint})"
        torch.cuda.init()
    except Exception as e:  # RuntimeError "Found no NVIDIA driver", "CUDA driver too old"
        return f"CUDA initialisation failed: {' '.join(str(e).split())}"
    return None


@dataclass(frozen=True)
class HostFacts:
    room: int | None
    room_source: str
    memlock: int | None
    memlock_unlimited: bool
    nodes: dict[int, frozenset[int]] = field(default_factory=dict)


def host_facts(machine: Machine) -> HostFacts:
    from starvecheck.probe.cpu import parse_cpulist

    room, source = bw.headroom(
        machine.memory.available_bytes, machine.memory.limit_bytes, machine.memory.usage_bytes
    )
    nodes = {}
    for n in machine.numa.node_list:
        cpus = parse_cpulist(n.cpus) if n.cpus else None
        if cpus:
            nodes[n.id] = cpus
    return HostFacts(
        room,
        source,
        machine.limits.memlock_bytes,
        "limits.memlock_bytes" in machine.not_applicable,
        nodes,
    )


def size_plan(plan: Plan, facts: HostFacts) -> bw.SizePlan:
    return bw.plan_sizes(
        plan.sizes, facts.room, facts.room_source, facts.memlock, facts.memlock_unlimited
    )


def _host_parameters(machine: Machine, facts: HostFacts, sp: bw.SizePlan) -> dict[str, Any]:
    return {
        "host_headroom_bytes": facts.room,
        "host_headroom_source": facts.room_source,
        "pinned_budget_bytes": sp.budget_bytes,
        "memlock_bytes": facts.memlock,
        "memlock_unlimited": facts.memlock_unlimited,
        "numa_nodes": len(machine.numa.node_list) or None,
        "sizes_measured": [bw.size_name(s) for s in sp.sizes],
        "sizes_skipped": {bw.size_name(s): why for s, why in sp.skipped},
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "pci_bus_id": g.pci_bus_id,
                "link_idle": [g.pcie.gen_current, g.pcie.width_current],
                "link_max": [g.pcie.gen_max, g.pcie.width_max],
                "theoretical_gbps_max": g.pcie.theoretical_gbps_max,
                "numa_node": g.numa_node,
            }
            for g in machine.gpus
        ],
    }


def stable_names(sizes: tuple[int, ...]) -> list[tuple[str, str]]:
    """(name, unit) of every figure the issue promises scripts, for this plan."""
    names = [
        (f"{d}.{mem}.{bw.size_name(s)}", "GB/s")
        for d in DIRECTIONS
        for mem in MEMORIES
        for s in sizes
    ]
    names += [(f"overlap.{mem}.{mode}", "fraction") for mem in MEMORIES for mode in MODES]
    names += [
        ("link.gen_under_load", "gen"),
        ("link.width_under_load", "lanes"),
        ("link.efficiency", "fraction"),
        ("reference_ratio", "ratio"),
    ]
    return names


def cpu_side(
    machine: Machine, *, reason: str | None = None, plan: Plan | None = None
) -> StageResult:
    """The report without a CUDA device: host memory for pinned buffers, memlock,
    NUMA, each GPU's link and theoretical peak; every measured figure missing with
    the reason, so scripts find the names they expect."""
    from starvecheck.advice.pcie import advise

    start = time.perf_counter()
    plan = plan or Plan.default(quick=False)
    facts = host_facts(machine)
    sp = size_plan(plan, facts)
    why = f"not measured: {reason}" if reason else "not measured: no CUDA device"
    metrics = [Metric.missing(name, unit, why) for name, unit in stable_names(plan.sizes)]
    caveats = [
        "no CUDA device: host-side facts only; the GPU table's max GB/s is the theoretical "
        "peak of each link at its maximum generation and width, per direction"
    ]
    caveats += list(sp.notes)
    if not machine.real:
        caveats.append(
            f"facts read from the fake sysroot {machine.sysroot} (STARVECHECK_SYSROOT), "
            "not from this machine"
        )
    params = {"cuda": False, **plan.parameters(), **_host_parameters(machine, facts, sp)}
    return StageResult(
        stage="pcie",
        parameters=params,
        metrics=tuple(metrics),
        findings=advise(metrics, params),
        caveats=tuple(caveats),
        duration_s=round(time.perf_counter() - start, 4),
    )


def run(
    plan: Plan,
    machine: Machine,
    progress: Progress,
    warn: Callable[[str], None],
) -> StageResult:
    """Measure on the current CUDA device; Unavailable (exit 3) when there is none."""
    reason = cuda_unavailable()
    if reason is not None:
        raise Unavailable(f"pcie needs a CUDA device: {reason}")
    from starvecheck.advice.pcie import advise
    from starvecheck.stages.pcie_cuda import Measurement

    start = time.perf_counter()
    facts = host_facts(machine)
    sp = size_plan(plan, facts)
    m = Measurement(plan, machine, facts, sp, progress, warn)
    try:
        m.run()
    except RuntimeError as e:  # a CUDA error that is no one measurement's
        raise Unavailable(f"CUDA failed during the copies: {' '.join(str(e).split())}") from e
    params = {
        "cuda": True,
        **plan.parameters(),
        **_host_parameters(machine, facts, sp),
        **m.parameters,
    }
    return StageResult(
        stage="pcie",
        parameters=params,
        metrics=tuple(m.metrics),
        findings=advise(m.metrics, params),
        caveats=tuple(list(sp.notes) + m.caveats),
        duration_s=round(time.perf_counter() - start, 3),
    )


def matching_gpu(machine: Machine, bus: str | None) -> Any:
    """The machine record's GPU with this PCI bus id (None when unknown)."""
    wanted = normalise_bus_id(bus) if bus else None
    if wanted is None:
        return None
    return next((g for g in machine.gpus if g.pci_bus_id == wanted), None)
