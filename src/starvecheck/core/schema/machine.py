"""The machine record: what probe/machine.collect fills and every report carries as
its `machine` (`Machine.to_dict()`, the JSON; `Report.facts`, the record read back).
Plain values, every None explained in `Machine.unknown` or `Machine.not_applicable`
under its dotted JSON key ("cpu.quota_cpus"). Declared here, in the vocabulary, so that
render/ (which never imports probe/) reads the record probe/ builds; this module
imports nothing of starvecheck's but a type, and probe/ may import it."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar, Union, get_args, get_origin, get_type_hints

if TYPE_CHECKING:
    from starvecheck.core.jsonvalue import JsonDict, JsonObject, JsonValue

ABSENT = "absent"  # a field's metadata: its value where a stored report lacks it
T = TypeVar("T")


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
    real: bool = field(metadata={ABSENT: True})
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

    def to_dict(self) -> JsonDict:
        out: JsonDict = asdict(self)
        return out

    @classmethod
    def from_dict(cls, d: JsonObject) -> Machine:
        """The record a report's `machine` holds, from a fresh report or a stored one
        alike, never raising: a value of the wrong type reads as None (a list or a
        mapping as empty, a nested record's missing fields as theirs); a flag or a
        text that must be there, as false or empty, but `real`, as true."""
        return _read(cls, d)


def _read(kind: type[T], d: JsonObject) -> T:
    """A record of `kind` from a JSON object, field by field (Machine.from_dict)."""
    hints = get_type_hints(kind)
    values = {f.name: _value(hints[f.name], d.get(f.name), f.metadata.get(ABSENT, MISSING))
              for f in fields(kind)}  # type: ignore[arg-type]  # fmt: skip
    return kind(**values)


def _value(hint: Any, value: JsonValue, absent: Any) -> Any:
    """`value` as the field typed `hint` holds it: None where it is of another type
    and the field allows None, else `absent` or its type's empty value."""
    optional = get_origin(hint) in (Union, types.UnionType)
    kinds = [k for k in get_args(hint) if k is not type(None)] if optional else [hint]
    for k in kinds:
        origin = get_origin(k)
        if is_dataclass(k) and isinstance(k, type) and isinstance(value, Mapping):
            return _read(k, value)
        if origin is list and isinstance(value, list):
            (item,) = get_args(k)
            if is_dataclass(item) and isinstance(item, type):
                return [_read(item, x) for x in value if isinstance(x, Mapping)]
            return [x for x in value if isinstance(x, item)]
        if origin is dict and isinstance(value, Mapping):
            return {str(key): x for key, x in value.items() if isinstance(x, str)}
        if k in (int, float, str, bool) and _is(value, k):
            return value
    if optional:
        return None
    if absent is not MISSING:
        return absent
    k = kinds[0]
    return _read(k, {}) if is_dataclass(k) and isinstance(k, type) else (get_origin(k) or k)()


def _is(value: JsonValue, kind: type) -> bool:
    """Whether a JSON value is of a field's scalar type (an int is a float's, never a
    bool an int's)."""
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)
