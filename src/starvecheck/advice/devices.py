"""env's checks of the devices a training job uses: its GPUs (the torch build that
drives them, their NUMA node, their PCIe link) and the storage the data path is on.

Each check, as advice/env.py's, looks at the machine facts it needs and returns
nothing when it does not apply, an `ok` finding when it passed, or a finding with the
evidence and the exact change; advice/env.py lists them all, in the order they run.
"""

from __future__ import annotations

from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Gain, GainKind, Severity
from starvecheck.probe.cpu import format_cpulist, parse_cpulist
from starvecheck.probe.machine import GpuInfo, Machine


def _gpu_list(gpus: list[GpuInfo]) -> str:
    return format_cpulist(frozenset(g.index for g in gpus))


def check_numa(m: Machine) -> Finding | None:
    if not m.gpus or m.cpu.affinity_list is None or (m.numa.nodes or 1) < 2:
        return None
    mine = parse_cpulist(m.cpu.affinity_list) or frozenset()
    node_cpus = {n.id: parse_cpulist(n.cpus or "") or frozenset() for n in m.numa.node_list}
    my_nodes = sorted(i for i, cpus in node_cpus.items() if cpus & mine)
    placed = [g for g in m.gpus if g.numa_node is not None and g.numa_node in node_cpus]
    if not placed:
        return None
    remote = [g for g in placed if g.numa_node is not None and not node_cpus[g.numa_node] & mine]
    if remote:
        by_node: dict[int, list[GpuInfo]] = {}
        for g in remote:
            by_node.setdefault(g.numa_node or 0, []).append(g)
        where = "; ".join(
            f"GPU {_gpu_list(gs)} on node {n} (CPUs {format_cpulist(node_cpus[n])})"
            for n, gs in sorted(by_node.items())
        )
        binds = "; ".join(
            f"numactl --cpunodebind={n} --membind={n} for GPU {_gpu_list(gs)}"
            for n, gs in sorted(by_node.items())
        )
        return Finding(
            catalogue.ENV_NUMA_REMOTE_GPU,
            Severity.WARNING,
            f"{len(remote)} of {len(placed)} GPUs are on a NUMA node this process cannot run on",
            f"this process may run on CPUs {m.cpu.affinity_list} (node "
            f"{', '.join(map(str, my_nodes))}); {where}. Copies to those GPUs, and the pinned "
            "buffers the DataLoader fills, cross the socket interconnect.",
            "Drive each GPU from its own node: torchrun --numa-binding=node ... (PyTorch 2.9+; "
            f"PyTorch reports 1-10% typical gains), or {binds}.",
        )
    gpu_nodes = sorted({g.numa_node for g in placed if g.numa_node is not None})
    if len(my_nodes) > 1 and len(gpu_nodes) > 1:
        return Finding(
            catalogue.ENV_NUMA_UNBOUND,
            Severity.INFO,
            f"this process may run on all {len(my_nodes)} NUMA nodes; its GPUs sit on "
            f"{len(gpu_nodes)}",
            f"affinity {m.cpu.affinity_list}; GPUs by node: "
            + "; ".join(
                f"node {n}: GPU {_gpu_list([g for g in placed if g.numa_node == n])}"
                for n in gpu_nodes
            )
            + ". Unbound, a rank and its DataLoader workers may run on the other socket.",
            "Bind each rank to its GPU's node: torchrun --numa-binding=node ... (PyTorch 2.9+).",
        )
    return Finding(
        catalogue.ENV_NUMA, Severity.OK, "every GPU is on a NUMA node this process runs on"
    )


def check_pcie_width(m: Machine) -> Finding | None:
    known = [g for g in m.gpus if g.pcie.width_current and g.pcie.width_max]
    if not known:
        return None
    # Both widths are known here (`known`): the `or`s only say so to the type checker.
    narrow = [g for g in known if (g.pcie.width_current or 0) < (g.pcie.width_max or 0)]
    if not narrow:
        full = f"x{known[0].pcie.width_max}"
        return Finding(
            catalogue.ENV_PCIE_WIDTH,
            Severity.OK,
            f"every GPU's PCIe link runs at its full width ({full})",
        )
    lines = []
    for g in narrow:
        peak = g.pcie.theoretical_gbps_max
        current, most = g.pcie.width_current or 0, g.pcie.width_max or 1
        now = (g.pcie.theoretical_gbps_max or 0) * current / most
        lines.append(
            f"GPU {g.index} ({g.pci_bus_id}) x{g.pcie.width_current} of "
            f"x{g.pcie.width_max}"
            + (
                f": {now:.1f} of {peak:.1f} GB/s per direction at gen {g.pcie.gen_max}"
                if peak
                else ""
            )
        )
    return Finding(
        catalogue.ENV_PCIE_WIDTH_DEGRADED,
        Severity.WARNING,
        f"{len(narrow)} GPU link{'s' if len(narrow) > 1 else ''} trained below full width",
        "; ".join(lines) + ". Width, unlike speed, does not drop when a GPU idles: fewer lanes "
        "mean a slot wired narrower, a riser or cable fault, or a bifurcation setting.",
        "Reseat the GPU (and riser), check the slot's wired width and the BIOS PCIe "
        "bifurcation setting; `starvecheck pcie` measures the bandwidth under load.",
    )


def check_pcie_gen(m: Machine) -> Finding | None:
    slow = [
        g
        for g in m.gpus
        if g.pcie.gen_current and g.pcie.gen_max and g.pcie.gen_current < g.pcie.gen_max
    ]
    if not slow:
        return None
    pairs = sorted({(g.pcie.gen_current, g.pcie.gen_max) for g in slow})
    gens = ", ".join(f"gen {c} of {mx}" for c, mx in pairs)
    return Finding(
        catalogue.ENV_PCIE_GEN_BELOW_MAX,
        Severity.INFO,
        f"{len(slow)} GPU link{'s' if len(slow) > 1 else ''} at a lower PCIe generation now "
        f"({gens})",
        f"GPU {_gpu_list(slow)}: {gens}, read while idle. Idle GPUs lower their link speed "
        "to save power; `starvecheck pcie` measures it under load.",
        "Nothing to change unless it stays low under load.",
    )


def check_torch_build(m: Machine) -> Finding | None:
    # On a fake sysroot the installed torch is this machine's, not the fake one's.
    if not m.real or not m.gpus or m.software.torch is None:
        return None
    if m.software.torch_cuda is None and "software.torch_cuda" in m.not_applicable:
        return Finding(
            catalogue.ENV_TORCH_CPU_BUILD,
            Severity.CRITICAL,
            f"torch {m.software.torch} is a CPU-only build on a machine with "
            f"{len(m.gpus)} NVIDIA GPU{'s' if len(m.gpus) > 1 else ''}",
            "torch/version.py has cuda = None: torch.cuda.is_available() is False and "
            "training runs on the CPU.",
            "Install a CUDA build that matches the driver"
            + (
                f" (driver supports CUDA {m.gpu_driver.cuda_driver_version})"
                if m.gpu_driver.cuda_driver_version
                else ""
            )
            + ", e.g. pip install torch --index-url https://download.pytorch.org/whl/cu124.",
            Gain(GainKind.BLOCKER, basis="the GPUs are not used at all"),
        )
    return None


def check_no_gpu(m: Machine) -> Finding | None:
    if m.gpus:
        return None
    return Finding(
        catalogue.ENV_NO_GPU,
        Severity.INFO,
        "no NVIDIA GPU is visible",
        m.not_applicable.get("gpus", ""),
        "GPU measurements (PCIe bandwidth, GPU step time) need a machine with one.",
    )


def check_storage(m: Machine) -> Finding | None:
    s = m.storage
    if s.kind is None:
        return None
    where = f"{s.path} is on {s.mount_point} ({s.fstype} from {s.source})"
    if s.kind in ("network", "fuse"):
        what = (
            "a FUSE filesystem (user space, usually backed by a network or object store)"
            if s.kind == "fuse"
            else f"a network filesystem ({s.fstype})"
        )
        return Finding(
            catalogue.ENV_NETWORK_STORAGE,
            Severity.WARNING,
            f"the data path is on {what}",
            f"{where}. Each file open and read costs a network round trip; many small files "
            "read in shuffled order are the slowest case.",
            "Copy the dataset to local NVMe on each node before training, or store it as "
            "large shards (MosaicML Streaming MDS, WebDataset) that stream sequentially "
            "and cache locally.",
        )
    if s.rotational:
        return Finding(
            catalogue.ENV_ROTATIONAL_STORAGE,
            Severity.WARNING,
            "the data path is on a rotational disk",
            f"{where}; the kernel marks the device rotational (queue/rotational = 1; virtual "
            "disks report 1 unless the hypervisor says otherwise). A random read of a small "
            "file costs a seek, milliseconds each.",
            "Move the dataset to SSD/NVMe, or store it as large shards read sequentially.",
        )
    if s.kind == "memory":
        return Finding(catalogue.ENV_STORAGE, Severity.OK, f"{s.path} is in memory ({s.fstype})")
    if s.rotational is False:
        return Finding(
            catalogue.ENV_STORAGE,
            Severity.OK,
            f"{s.path} is on local solid-state storage ({s.fstype})",
        )
    return None
