"""NVIDIA GPUs: NVML where it works, sysfs always.

Fallback chain, field by field:
  1. NVML: names, memory, utilisation, and the PCIe link as the driver sees it;
  2. sysfs (/sys/bus/pci/devices/<bdf>): vendor 0x10de with a display or 3D
     controller class, the link speed and width, the NUMA node. It needs no
     driver, so a node whose driver is broken still shows its GPUs;
  3. unknown, with the reason.
GPUs are matched across the two by PCI bus id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from starvecheck.probe.fact import Fact
from starvecheck.probe.nvml import (
    FAKE_FILE,
    FakeNvmlSource,
    NvmlGpu,
    NvmlSnapshot,
    NvmlSource,
    NvmlUnavailable,
    PynvmlSource,
    normalise_bus_id,
)
from starvecheck.probe.sysroot import SysRoot
from starvecheck.probe.text import is_uint

NVIDIA_VENDOR = "0x10de"
PCI_DEVICES = "/sys/bus/pci/devices"
# PCI class codes (base class 0x03 display): 0x0300 VGA, 0x0302 3D controller.
# NVSwitches (0x0680, bridge) and NVIDIA audio functions (0x0403) are not GPUs.
GPU_CLASSES = ("0x0300", "0x0302")

# GT/s per lane -> PCIe generation (PCI_EXP_LNKSTA speeds as sysfs prints them).
GTS_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}
# Usable GB/s per lane per direction after line coding, by generation.
GEN_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563, 7: 15.125}


def parse_link_speed(text: str) -> int | None:
    """ "16.0 GT/s PCIe" (or "8 GT/s", "2.5 GT/s") -> generation 4; None when unknown."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", text)
    return GTS_TO_GEN.get(float(m.group(1))) if m else None


def parse_link_width(text: str) -> int | None:
    """ "16" -> 16. Width 0 (link down) and 255 (not reported) are unknown."""
    text = text.strip().lstrip("x")
    if not is_uint(text):
        return None
    width = int(text)
    return width if 0 < width <= 32 else None


def theoretical_gbps(gen: int | None, width: int | None) -> float | None:
    """Usable bandwidth per direction of a link: 4.0 x16 = 31.5 GB/s."""
    if gen is None or width is None or gen not in GEN_LANE_GBPS:
        return None
    return round(GEN_LANE_GBPS[gen] * width, 2)


@dataclass(frozen=True)
class PciGpu:
    bus_id: str
    device_id: str | None
    gen_current: int | None
    gen_max: int | None
    width_current: int | None
    width_max: int | None
    numa_node: int | None
    local_cpus: str | None


def scan_sysfs(root: SysRoot) -> list[PciGpu]:
    gpus = []
    for bdf in root.listdir(PCI_DEVICES):
        base = f"{PCI_DEVICES}/{bdf}"

        def read(name: str, base: str = base) -> str:
            text = root.read(f"{base}/{name}")
            return (text.value or "").strip() if text.known else ""

        if read("vendor").lower() != NVIDIA_VENDOR or not read("class").lower().startswith(
            GPU_CLASSES
        ):
            continue
        numa = read("numa_node")
        numa_node = int(numa) if is_uint(numa) else None  # -1: no NUMA info
        gpus.append(
            PciGpu(
                bus_id=normalise_bus_id(bdf) or bdf,
                device_id=read("device") or None,
                gen_current=parse_link_speed(read("current_link_speed")),
                gen_max=parse_link_speed(read("max_link_speed")),
                width_current=parse_link_width(read("current_link_width")),
                width_max=parse_link_width(read("max_link_width")),
                numa_node=numa_node,
                local_cpus=read("local_cpulist") or None,
            )
        )
    return gpus


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML index when NVML knows the GPU, else the order in sysfs
    name: str | None
    pci_bus_id: str | None
    memory_total_bytes: int | None
    gen_current: int | None
    gen_max: int | None
    width_current: int | None
    width_max: int | None
    numa_node: int | None
    cpu_affinity: str | None
    utilization_pct: int | None
    source: str  # "nvml+sysfs", "nvml" or "sysfs"
    unknown: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuFacts:
    gpus: list[Gpu]
    driver_version: Fact[str]
    cuda_driver_version: Fact[str]
    nvml: Fact[str]  # "ok", or unknown with why NVML could not be used


def nvml_source_for(root: SysRoot, logical_cpus: int | None) -> NvmlSource:
    """The real NVML for the real machine; a fake sysroot carries its own (or none)."""
    if root.real:
        return PynvmlSource(logical_cpus)
    text = root.read(f"/{FAKE_FILE}")
    if text.known:
        return FakeNvmlSource.from_text(text.value or "")
    return FakeNvmlSource(None, f"the fake sysroot has no {FAKE_FILE}")


def probe_gpus(root: SysRoot, source: NvmlSource) -> GpuFacts:
    try:
        snap: NvmlSnapshot | None = source.read()
        nvml: Fact[str] = Fact.of("ok")
    except NvmlUnavailable as e:
        snap, nvml = None, Fact.unknown(str(e))
    except Exception as e:  # a misbehaving driver library must not take env down
        snap, nvml = None, Fact.unknown(f"NVML failed: {type(e).__name__}: {e}")
    pci = {g.bus_id: g for g in scan_sysfs(root)}
    gpus: list[Gpu] = []
    seen: set[str] = set()
    for dev in snap.devices if snap else ():
        bus = normalise_bus_id(dev.pci_bus_id or "") if dev.pci_bus_id else None
        sys_gpu = pci.get(bus) if bus else None
        if bus:
            seen.add(bus)
        gpus.append(_merge(dev, sys_gpu, bus))
    for bus, sys_gpu in sorted(pci.items()):
        if bus not in seen:  # NVIDIA hardware that NVML did not list (or no NVML at all)
            gpus.append(_from_sysfs(len(gpus), sys_gpu, nvml.reason or ""))
    driver = (
        Fact.of(snap.driver_version)
        if snap and snap.driver_version
        else Fact.unknown(nvml.reason or "NVML did not report a driver version")
    )
    cuda = (
        Fact.of(format_cuda_version(snap.cuda_driver_version))
        if snap and snap.cuda_driver_version
        else Fact.unknown(nvml.reason or "NVML did not report a CUDA driver version")
    )
    return GpuFacts(gpus, driver, cuda, nvml)


def format_cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _merge(dev: NvmlGpu, sys_gpu: PciGpu | None, bus: str | None) -> Gpu:
    unknown = dict(dev.errors)

    def pick(nvml_value, sysfs_value, key: str):
        # sysfs reads the PCIe capability registers directly; NVML asks the driver.
        # They agree on healthy systems; NVML first because it is what the driver uses.
        value = nvml_value if nvml_value is not None else sysfs_value
        if value is None:
            unknown.setdefault(key, "neither NVML nor sysfs reported it")
        return value

    gpu = Gpu(
        index=dev.index,
        name=dev.name,
        pci_bus_id=bus,
        memory_total_bytes=dev.memory_total_bytes,
        gen_current=pick(dev.pcie_gen_current, sys_gpu and sys_gpu.gen_current, "pcie.gen_current"),
        gen_max=pick(dev.pcie_gen_max, sys_gpu and sys_gpu.gen_max, "pcie.gen_max"),
        width_current=pick(
            dev.pcie_width_current, sys_gpu and sys_gpu.width_current, "pcie.width_current"
        ),
        width_max=pick(dev.pcie_width_max, sys_gpu and sys_gpu.width_max, "pcie.width_max"),
        # The kernel's numa_node is the authority; NVML's (newer drivers) is the fallback.
        numa_node=pick(sys_gpu and sys_gpu.numa_node, dev.numa_node, "numa_node"),
        cpu_affinity=dev.cpu_affinity or (sys_gpu.local_cpus if sys_gpu else None),
        utilization_pct=dev.utilization_gpu_pct,
        source="nvml+sysfs" if sys_gpu else "nvml",
    )
    # An NVML error matters only where no source filled the field in.
    values = {
        "pcie.gen_current": gpu.gen_current,
        "pcie.gen_max": gpu.gen_max,
        "pcie.width_current": gpu.width_current,
        "pcie.width_max": gpu.width_max,
        "cpu_affinity": gpu.cpu_affinity,
        "numa_node": gpu.numa_node,
        "pci_bus_id": gpu.pci_bus_id,
    }
    kept = {k: v for k, v in unknown.items() if k not in values or values[k] is None}
    return replace(gpu, unknown=kept)


def _from_sysfs(index: int, g: PciGpu, nvml_reason: str) -> Gpu:
    why = f"NVML unavailable ({nvml_reason})" if nvml_reason else "not reported by NVML"
    unknown = {"name": why, "memory_total_bytes": why, "utilization_pct": why}
    for key, value in (
        ("pcie.gen_current", g.gen_current),
        ("pcie.gen_max", g.gen_max),
        ("pcie.width_current", g.width_current),
        ("pcie.width_max", g.width_max),
        ("numa_node", g.numa_node),
    ):
        if value is None:
            unknown[key] = "not reported by sysfs"
    return Gpu(
        index,
        None,
        g.bus_id,
        None,
        g.gen_current,
        g.gen_max,
        g.width_current,
        g.width_max,
        g.numa_node,
        g.local_cpus,
        None,
        "sysfs",
        unknown,
    )
