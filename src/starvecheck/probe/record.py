"""The machine record `collect` fills: plain values, every None explained in
`Machine.unknown` or `Machine.not_applicable` under its dotted JSON key."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cpu:
    model: str | None
    logical: int | None  # os.cpu_count(): every online CPU of the machine
    physical: int | None
    affinity: int | None  # how many CPUs this process may run on
    affinity_list: str | None
    quota_cpus: float | None  # cgroup CFS quota in CPUs (1.5 = 150 ms per 100 ms)
    effective_cpus: int | None  # min(affinity, ceil(quota)): what workers really get


@dataclass(frozen=True)
class Throttling:
    nr_periods: int
    nr_throttled: int
    throttled_s: float
    share: float  # throttled periods / periods
    path: str


@dataclass(frozen=True)
class Cgroup:
    version: int | None
    mode: str | None
    cpu_path: str | None
    quota_path: str | None
    throttling: Throttling | None


@dataclass(frozen=True)
class Memory:
    total_bytes: int | None
    available_bytes: int | None
    limit_bytes: int | None
    usage_bytes: int | None
    swap_total_bytes: int | None
    swap_free_bytes: int | None


@dataclass(frozen=True)
class Shm:
    mounted: bool
    fstype: str | None
    size_bytes: int | None
    free_bytes: int | None


@dataclass(frozen=True)
class Limits:
    nofile: int | None
    nofile_hard: int | None
    memlock_bytes: int | None  # None with not_applicable when unlimited
    memlock_hard_bytes: int | None
    pids_max: int | None


@dataclass(frozen=True)
class NumaNodeInfo:
    id: int
    cpus: str | None
    memory_bytes: int | None


@dataclass(frozen=True)
class Numa:
    nodes: int | None
    node_list: list[NumaNodeInfo]


@dataclass(frozen=True)
class Pcie:
    gen_current: int | None
    gen_max: int | None
    width_current: int | None
    width_max: int | None
    theoretical_gbps_current: float | None
    theoretical_gbps_max: float | None


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str | None
    pci_bus_id: str | None
    memory_total_bytes: int | None
    pcie: Pcie
    numa_node: int | None
    cpu_affinity: str | None
    utilization_pct: int | None
    source: str


@dataclass(frozen=True)
class GpuDriver:
    nvml: str | None
    driver_version: str | None
    cuda_driver_version: str | None


@dataclass(frozen=True)
class Container:
    runtime: str | None
    kubernetes: bool
    evidence: list[str]


@dataclass(frozen=True)
class Storage:
    path: str
    mount_point: str | None
    fstype: str | None
    source: str | None
    kind: str | None  # local, network, fuse, memory
    network: bool | None
    rotational: bool | None
    free_bytes: int | None


@dataclass(frozen=True)
class Software:
    python: str
    torch: str | None
    torch_cuda: str | None
    transformers: str | None
    streaming: str | None
    numpy: str | None
    nvidia_ml_py: str | None


@dataclass(frozen=True)
class Machine:
    sysroot: str
    # False when facts come from a fake sysroot; `software` then still describes the
    # Python environment starvecheck runs in, not the fake machine.
    real: bool
    hostname: str | None
    kernel: str | None
    cpu: Cpu
    cgroup: Cgroup
    memory: Memory
    shm: Shm
    limits: Limits
    numa: Numa
    gpus: list[GpuInfo]
    gpu_driver: GpuDriver
    container: Container
    storage: Storage
    software: Software
    unknown: dict[str, str] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
