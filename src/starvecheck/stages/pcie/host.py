"""What the host side of `pcie` knows before any copy: the plan, whether CUDA can be
used, the memory and NUMA facts pinned buffers depend on, and which GPU of the
machine record a device is. No torch at import time; shared by the package's
`__init__` (the stage and its report without a device) and `measure` (the steps on
a device)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from starvecheck.core.signals import importing
from starvecheck.probe.machine import Machine
from starvecheck.probe.nvml import normalise_bus_id
from starvecheck.stages.options import PcieOptions
from starvecheck.stages.pcie import bandwidth as bw


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
            return cls(bw.QUICK_SIZES, PcieOptions.RUNS[True], warmup=2, quick=True, load_s=0.3)
        return cls(bw.DEFAULT_SIZES, PcieOptions.RUNS[False], warmup=3, quick=False, load_s=1.0)

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
        with importing("torch"):
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


def matching_gpu(machine: Machine, bus: str | None) -> Any:
    """The machine record's GPU with this PCI bus id (None when unknown)."""
    wanted = normalise_bus_id(bus) if bus else None
    if wanted is None:
        return None
    return next((g for g in machine.gpus if g.pci_bus_id == wanted), None)
