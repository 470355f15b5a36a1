"""NVML, behind one small interface that tests replace.

`NvmlSource.read()` returns a snapshot of every GPU or raises `NvmlUnavailable`
with the reason (no library, no driver, no permission). `PynvmlSource` talks to
the real library through nvidia-ml-py (module `pynvml`); `FakeNvmlSource` serves
a snapshot from JSON, which is how a fake sysroot carries its GPUs
(`<sysroot>/starvecheck-fake-nvml.json`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, TypeVar

from starvecheck.probe.cpu import format_cpulist

FAKE_FILE = "starvecheck-fake-nvml.json"
T = TypeVar("T")


class NvmlUnavailable(Exception):
    """NVML cannot be used here; str() is the reason."""


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    utilization_gpu_pct: int | None = None
    cpu_affinity: str | None = None  # cpulist, as NVML's ideal CPUs for this GPU
    numa_node: int | None = None
    # why a field is missing, keyed by its path in the machine record ("pcie.gen_max")
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NvmlSnapshot:
    driver_version: str | None
    cuda_driver_version: int | None  # 12040 means CUDA 12.4
    devices: tuple[NvmlGpu, ...]


class NvmlSource(Protocol):
    def read(self) -> NvmlSnapshot: ...


def snapshot_from_dict(d: Mapping[str, Any]) -> NvmlSnapshot:
    known = set(NvmlGpu.__dataclass_fields__)
    devices = tuple(
        NvmlGpu(**{k: v for k, v in dev.items() if k in known}) for dev in d.get("devices", ())
    )
    return NvmlSnapshot(d.get("driver_version"), d.get("cuda_driver_version"), devices)


class FakeNvmlSource:
    def __init__(self, snapshot: NvmlSnapshot | None, reason: str = "") -> None:
        self.snapshot, self.reason = snapshot, reason

    @classmethod
    def from_text(cls, text: str) -> FakeNvmlSource:
        try:
            return cls(snapshot_from_dict(json.loads(text)))
        except (ValueError, TypeError, AttributeError, RecursionError) as e:  # [[[[...
            return cls(None, f"fake NVML file is not a valid snapshot: {e}")

    def read(self) -> NvmlSnapshot:
        if self.snapshot is None:
            raise NvmlUnavailable(self.reason or "fake NVML has no GPUs")
        return self.snapshot


def affinity_words_to_cpulist(words: list[int], bits: int = 64) -> str:
    """NVML's CPU affinity bitmask (array of unsigned longs, CPU 0 = bit 0 of word 0)."""
    cpus = {w * bits + b for w, word in enumerate(words) for b in range(bits) if word >> b & 1}
    return format_cpulist(frozenset(cpus))


def normalise_bus_id(bus_id: str) -> str | None:
    """ "00000000:2A:00.0" (NVML) and "0000:2a:00.0" (sysfs) -> "0000:2a:00.0"."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    domain, bus, devfn = parts
    try:
        dev, fn = devfn.split(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16)}"
    except ValueError:
        return None


@contextlib.contextmanager
def session() -> Iterator[ModuleType]:
    """The NVML module, initialised for the length of the block and shut down after:
    the one place starvecheck opens NVML for live queries (pcie's link under load).
    NvmlUnavailable, with the reason in one line, when it cannot be opened."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e})") from e
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError, or OSError when the library cannot be loaded
        raise NvmlUnavailable(" ".join(str(e).split())) from e
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


class PynvmlSource:
    """The real NVML. Each per-device query can fail alone (NOT_SUPPORTED on some
    GPUs, NO_PERMISSION in some containers); the snapshot keeps what it can."""

    def __init__(self, logical_cpus: int | None = None) -> None:
        self.logical_cpus = logical_cpus

    def read(self) -> NvmlSnapshot:
        try:
            import pynvml
        except ImportError as e:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e})") from e
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            hint = ""
            if getattr(e, "value", None) == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                hint = " (libnvidia-ml.so.1 not found: no NVIDIA driver in this environment)"
            raise NvmlUnavailable(f"{e}{hint}") from e
        except OSError as e:
            raise NvmlUnavailable(f"NVML library could not be loaded: {e}") from e
        try:
            return self._read(pynvml)
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def _read(self, nv: Any) -> NvmlSnapshot:
        driver = _try(lambda: _text(nv.nvmlSystemGetDriverVersion()), nv, {}, "driver")
        cuda = _try(nv.nvmlSystemGetCudaDriverVersion, nv, {}, "cuda")
        count = _try(nv.nvmlDeviceGetCount, nv, {}, "count")
        words = max(1, ((self.logical_cpus or 64) + 63) // 64)  # 64 CPUs per unsigned long
        devices = []
        for i in range(count or 0):
            errors: dict[str, str] = {}
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as e:
                devices.append(NvmlGpu(i, errors={"handle": str(e)}))
                continue
            values = {
                attr: _try(lambda get=get, h=h: get(nv, h), nv, errors, key)
                for attr, key, get in _DEVICE_FIELDS
            }
            affinity = _try(
                lambda h=h: list(nv.nvmlDeviceGetCpuAffinity(h, words)), nv, errors, "cpu_affinity"
            )
            if affinity:
                values["cpu_affinity"] = affinity_words_to_cpulist([int(w) for w in affinity])
            devices.append(NvmlGpu(index=i, errors=errors, **values))
        return NvmlSnapshot(driver, cuda, tuple(devices))


# NvmlGpu field, its path in the machine record (for the reason it is missing), getter.
_DEVICE_FIELDS: tuple[tuple[str, str, Callable[[Any, Any], Any]], ...] = (
    ("name", "name", lambda nv, h: _text(nv.nvmlDeviceGetName(h))),
    ("uuid", "uuid", lambda nv, h: _text(nv.nvmlDeviceGetUUID(h))),
    ("pci_bus_id", "pci_bus_id", lambda nv, h: _text(nv.nvmlDeviceGetPciInfo(h).busId)),
    ("memory_total_bytes", "memory_total_bytes", lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).total),
    (
        "pcie_gen_current",
        "pcie.gen_current",
        lambda nv, h: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
    ),
    # Max of what the GPU and the slot support together (not the GPU alone).
    ("pcie_gen_max", "pcie.gen_max", lambda nv, h: nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
    (
        "pcie_width_current",
        "pcie.width_current",
        lambda nv, h: nv.nvmlDeviceGetCurrPcieLinkWidth(h),
    ),
    ("pcie_width_max", "pcie.width_max", lambda nv, h: nv.nvmlDeviceGetMaxPcieLinkWidth(h)),
    (
        "utilization_gpu_pct",
        "utilization_pct",
        lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu,
    ),
    ("numa_node", "numa_node", lambda nv, h: nv.nvmlDeviceGetNumaNodeId(h)),
)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _try(fn: Callable[[], T], nv: Any, errors: dict[str, str], key: str) -> T | None:
    try:
        return fn()
    except nv.NVMLError as e:
        errors[key] = f"NVML: {e}"
    except (AttributeError, TypeError, ValueError) as e:  # an older pynvml lacks the call
        errors[key] = f"NVML call unavailable: {e}"
    return None
