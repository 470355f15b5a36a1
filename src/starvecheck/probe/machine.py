"""Collect every probe into one `Machine` record (its classes: core/schema/machine.py).

Values are plain (int, str, None); every None is explained in `unknown` (could
not be read) or `not_applicable` (does not exist here: no quota, no GPU) under
its dotted JSON key, e.g. "cpu.quota_cpus".
"""

from __future__ import annotations

import math
import os
import posixpath
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from starvecheck.core.schema.machine import (
    Cgroup,
    Container,
    Cpu,
    GpuDriver,
    GpuInfo,
    Limits,
    Machine,
    Memory,
    Numa,
    NumaNodeInfo,
    Pcie,
    Shm,
    Software,
    Storage,
    Throttling,
)
from starvecheck.probe.cgroup import CgroupFacts, probe_cgroup
from starvecheck.probe.container import ContainerFacts, probe_container
from starvecheck.probe.cpu import CpuFacts, format_cpulist, probe_cpu
from starvecheck.probe.fact import Fact, Ledger
from starvecheck.probe.gpu import Gpu, GpuFacts, nvml_source_for, probe_gpus, theoretical_gbps
from starvecheck.probe.memory import LimitsFacts, MemoryFacts, probe_limits, probe_memory
from starvecheck.probe.mounts import ShmFacts, StorageFacts, probe_shm, probe_storage, read_mounts
from starvecheck.probe.numa import NumaNode, probe_numa
from starvecheck.probe.nvml import NvmlSource
from starvecheck.probe.software import SoftwareFacts, probe_software
from starvecheck.probe.sysroot import SysRoot


def effective_cpus(affinity: int | None, quota: float | None, logical: int | None) -> int | None:
    """min(affinity, ceil(quota)), at least 1. ceil, as the JVM's container support
    does: a 1.5-CPU quota lets two busy processes finish more work than one."""
    candidates = [c for c in (affinity, math.ceil(quota) if quota else None) if c]
    if not candidates:
        return logical
    return max(1, min(candidates))


def process_cpus(root: SysRoot | None = None) -> float | None:
    """The CPUs this process may keep busy: its affinity, capped by the cgroup CPU
    quota, a fractional quota kept fractional (0.5 CPU is half a core's work per
    second). A few file reads, for callers that need no other fact (watch)."""
    root = root or SysRoot.from_environ({})
    affinity = probe_cpu(root).affinity
    quota = probe_cgroup(root, read_mounts(root)).quota_cpus
    count = len(affinity.value) if affinity.known and affinity.value else None
    q = quota.value if quota.known else None
    candidates = [float(c) for c in (count, q) if c]
    return min(candidates) if candidates else None


def collect(
    root: SysRoot,
    *,
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    nvml: NvmlSource | None = None,
) -> Machine:
    """Read every fact. Never raises for anything the machine says (or fails to say).

    One function per section of the record, called in the order the sections
    appear: each reason enters `led` in that order, and `unknown` and
    `not_applicable` keep it (the JSON and the renderers show them so).
    """
    environ = os.environ if environ is None else environ
    led = Ledger()
    mounts = read_mounts(root)
    cg = probe_cgroup(root, mounts)
    cpu = _cpu(led, probe_cpu(root), cg)
    cgroup = _cgroup(led, cg)
    memory = _memory(led, probe_memory(root), cg)
    shm = _shm(led, probe_shm(root, mounts, memory.total_bytes))
    limits = _limits(led, probe_limits(root), cg)
    numa = _numa(led, probe_numa(root))
    g = probe_gpus(root, nvml or nvml_source_for(root, cpu.logical))
    gpus = _gpus(led, g, numa)
    driver = _gpu_driver(led, g, any_gpu=bool(gpus))
    container = _container(led, probe_container(root, environ))
    storage = _storage(led, probe_storage(root, mounts, resolve_data_path(root, path)))
    software = _software(led, probe_software())
    return Machine(
        sysroot=str(root.root),
        real=root.real,
        hostname=_text(led, root, "/proc/sys/kernel/hostname", "hostname"),
        kernel=_text(led, root, "/proc/sys/kernel/osrelease", "kernel"),
        cpu=cpu,
        cgroup=cgroup,
        memory=memory,
        shm=shm,
        limits=limits,
        numa=numa,
        gpus=gpus,
        gpu_driver=driver,
        container=container,
        storage=storage,
        software=software,
        unknown=led.unknown,
        not_applicable=led.not_applicable,
    )


def _text(led: Ledger, root: SysRoot, p: str, key: str) -> str | None:
    """A one-line file's stripped text; an empty file is unknown, with its name."""
    fact = root.read(p)
    return led.take(
        key,
        Fact.of(fact.value.strip())
        if fact.known and fact.value
        else Fact.unknown(fact.reason or f"{p} is empty"),
    )


def _cpu(led: Ledger, cpu_f: CpuFacts, cg: CgroupFacts) -> Cpu:
    affinity_set = led.take("cpu.affinity", cpu_f.affinity)
    logical = led.take("cpu.logical", cpu_f.logical)
    quota = led.take("cpu.quota_cpus", cg.quota_cpus)
    affinity = len(affinity_set) if affinity_set else None
    eff = effective_cpus(affinity, quota, logical)
    if eff is None:
        led.unknown["cpu.effective_cpus"] = "neither affinity, quota nor CPU count is known"
    cpu = Cpu(
        model=led.take("cpu.model", cpu_f.model),
        logical=logical,
        physical=led.take("cpu.physical", cpu_f.physical),
        affinity=affinity,
        affinity_list=format_cpulist(affinity_set) if affinity_set else None,
        quota_cpus=quota,
        effective_cpus=eff,
    )
    if affinity is None:
        led.unknown["cpu.affinity_list"] = led.unknown.get("cpu.affinity", "unknown")
    return cpu


def _cgroup(led: Ledger, cg: CgroupFacts) -> Cgroup:
    thr = led.take("cgroup.throttling", cg.throttling)
    return Cgroup(
        version=led.take("cgroup.version", cg.version),
        mode=led.take("cgroup.mode", cg.mode),
        cpu_path=led.take("cgroup.cpu_path", cg.cpu_directory),
        quota_path=led.take("cgroup.quota_path", cg.quota_directory),
        throttling=Throttling(
            thr.nr_periods,
            thr.nr_throttled,
            round(thr.throttled_s, 3),
            round(thr.share, 4),
            thr.directory,
        )
        if thr
        else None,
    )


def _memory(led: Ledger, mem: MemoryFacts, cg: CgroupFacts) -> Memory:
    return Memory(
        total_bytes=led.take("memory.total_bytes", mem.total),
        available_bytes=led.take("memory.available_bytes", mem.available),
        limit_bytes=led.take("memory.limit_bytes", cg.memory_limit),
        usage_bytes=led.take("memory.usage_bytes", cg.memory_usage),
        swap_total_bytes=led.take("memory.swap_total_bytes", mem.swap_total),
        swap_free_bytes=led.take("memory.swap_free_bytes", mem.swap_free),
    )


def _shm(led: Ledger, shm_f: ShmFacts) -> Shm:
    if not shm_f.mounted:
        led.take("shm.fstype", Fact.unknown(shm_f.size.reason or "not mounted"))
    return Shm(
        shm_f.mounted,
        shm_f.fstype,
        led.take("shm.size_bytes", shm_f.size),
        led.take("shm.free_bytes", shm_f.free),
    )


def _limits(led: Ledger, lim: LimitsFacts, cg: CgroupFacts) -> Limits:
    return Limits(
        nofile=led.take("limits.nofile", lim.nofile_soft),
        nofile_hard=led.take("limits.nofile_hard", lim.nofile_hard),
        memlock_bytes=led.take("limits.memlock_bytes", lim.memlock_soft),
        memlock_hard_bytes=led.take("limits.memlock_hard_bytes", lim.memlock_hard),
        pids_max=led.take("limits.pids_max", cg.pids_limit),
    )


def _numa(led: Ledger, numa: Fact[list[NumaNode]]) -> Numa:
    nodes = led.take("numa.nodes", numa)
    return Numa(
        nodes=len(nodes) if nodes else None,
        node_list=[
            NumaNodeInfo(
                n.id, format_cpulist(n.cpus) if n.cpus is not None else None, n.memory_bytes
            )
            for n in nodes or []
        ],
    )


def _gpu_info(gpu: Gpu) -> GpuInfo:
    return GpuInfo(
        index=gpu.index,
        name=gpu.name,
        pci_bus_id=gpu.pci_bus_id,
        memory_total_bytes=gpu.memory_total_bytes,
        pcie=Pcie(
            gpu.gen_current,
            gpu.gen_max,
            gpu.width_current,
            gpu.width_max,
            theoretical_gbps(gpu.gen_current, gpu.width_current),
            theoretical_gbps(gpu.gen_max, gpu.width_max),
        ),
        numa_node=gpu.numa_node,
        cpu_affinity=gpu.cpu_affinity,
        utilization_pct=gpu.utilization_pct,
        source=gpu.source,
    )


def _gpus(led: Ledger, g: GpuFacts, numa: Numa) -> list[GpuInfo]:
    """The GPUs, every null among them and among the NUMA nodes explained (in that
    order: the record has always listed the GPUs' reasons first)."""
    for position, gpu in enumerate(g.gpus):
        for key, reason in gpu.unknown.items():
            led.unknown[f"gpus[{position}].{key}"] = reason
    gpus = [_gpu_info(gpu) for gpu in g.gpus]
    _explain_nulls([asdict(x) for x in gpus], "gpus", led, "not reported by NVML or sysfs")
    _explain_nulls(
        [asdict(n) for n in numa.node_list],
        "numa.node_list",
        led,
        "not readable in /sys/devices/system/node",
    )
    if len(numa.node_list) <= 1:
        # A one-node machine (most VMs: sysfs numa_node is -1 and NVML answers "Not
        # Supported") has no remote memory: the GPU's node is not a fact to miss.
        for position, gpu_info in enumerate(gpus):
            key = f"gpus[{position}].numa_node"
            if gpu_info.numa_node is None:
                reason = led.unknown.pop(key, None)
                led.not_applicable[key] = "one NUMA node: every CPU and all memory are local" + (
                    f" ({reason})" if reason else ""
                )
    if not gpus:
        led.not_applicable["gpus"] = (
            f"no NVIDIA GPU: NVML: {g.nvml.reason or 'lists none'}; sysfs: no device "
            "with vendor 0x10de and a display or 3D controller class"
        )
    return gpus


def _gpu_driver(led: Ledger, g: GpuFacts, *, any_gpu: bool) -> GpuDriver:
    driver_fact, cuda_fact = g.driver_version, g.cuda_driver_version
    if not any_gpu:  # no GPU: the driver's absence is not a fault to explain
        driver_fact = driver_fact if driver_fact.known else Fact.absent("no NVIDIA GPU")
        cuda_fact = cuda_fact if cuda_fact.known else Fact.absent("no NVIDIA GPU")
    return GpuDriver(
        nvml=g.nvml.value or g.nvml.reason,
        driver_version=led.take("gpu_driver.driver_version", driver_fact),
        cuda_driver_version=led.take("gpu_driver.cuda_driver_version", cuda_fact),
    )


def _container(led: Ledger, cont: ContainerFacts) -> Container:
    return Container(
        led.take("container.runtime", cont.runtime), cont.kubernetes, list(cont.evidence)
    )


def _storage(led: Ledger, st: StorageFacts) -> Storage:
    return Storage(
        path=st.path,
        mount_point=led.take("storage.mount_point", st.mount_point),
        fstype=led.take("storage.fstype", st.fstype),
        source=led.take("storage.source", st.source),
        kind=led.take("storage.kind", st.kind),
        network=led.take("storage.network", st.network),
        rotational=led.take("storage.rotational", st.rotational),
        free_bytes=led.take("storage.free_bytes", st.free_bytes),
    )


def _software(led: Ledger, soft: SoftwareFacts) -> Software:
    return Software(
        python=soft.python,
        torch=led.take("software.torch", soft.versions["torch"]),
        torch_cuda=led.take("software.torch_cuda", soft.torch_cuda),
        transformers=led.take("software.transformers", soft.versions["transformers"]),
        streaming=led.take("software.streaming", soft.versions["streaming"]),
        numpy=led.take("software.numpy", soft.versions["numpy"]),
        nvidia_ml_py=led.take("software.nvidia_ml_py", soft.versions["nvidia_ml_py"]),
    )


def _explain_nulls(value: Any, path: str, led: Ledger, reason: str) -> None:
    """Give every null inside list items a reason, so no null in the record is silent."""
    if isinstance(value, dict):
        for key, item in value.items():
            _explain_nulls(item, f"{path}.{key}", led, reason)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _explain_nulls(item, f"{path}[{i}]", led, reason)
    elif value is None and path not in led.unknown and path not in led.not_applicable:
        led.unknown[path] = reason


def working_directory(root: SysRoot) -> str:
    """The working directory as the (possibly fake) machine sees it: /proc/self/cwd."""
    link = root.readlink("/proc/self/cwd")
    if link.known and (link.value or "").startswith("/"):
        return link.value or "/"
    return os.getcwd() if root.real else "/"


def resolve_data_path(root: SysRoot, path: str | None) -> str:
    """`path` made absolute as the (possibly fake) machine sees it; None is its cwd."""
    cwd = working_directory(root)
    if path is None:
        return cwd
    if root.real:
        return os.path.realpath(path)
    # A fake machine: relative to its own working directory, never resolved
    # through this machine's symlinks.
    return posixpath.normpath(posixpath.join(cwd, path))
