"""A stand-in for torch's CUDA side, on the CPU, so `pcie`'s orchestration (every
step, every metric name, every way a step fails) runs in CI without a GPU.

Tensors are real CPU tensors of the installed torch; "device" and pinned buffers
are ordinary host memory, `synchronize` does nothing and events read the wall
clock. The figures it yields are host memcpy speeds and mean nothing about PCIe:
tests check names, shapes and failure handling, never values.
"""

from __future__ import annotations

import time
import types
from typing import Any


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t: float | None = None

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None, "event not recorded"
        return (end.t - self.t) * 1e3


def make(
    real_torch: Any,
    *,
    pinned_fails_above: int | None = None,
    device_count: int = 1,
) -> types.ModuleType:
    """A module object that `import torch` will return (put it in sys.modules)."""
    fake = types.ModuleType("torch")
    fake.__version__ = "2.13.0+fakecuda"
    fake.version = types.SimpleNamespace(cuda="12.4", hip=None)
    fake.uint8 = real_torch.uint8
    calls: dict[str, int] = {"synchronize": 0, "empty_host_cache": 0, "pinned": 0}
    fake.calls = calls

    def empty(size: int, dtype: Any = None, device: Any = None, pin_memory: bool = False) -> Any:
        if pin_memory:
            calls["pinned"] += 1
            if pinned_fails_above is not None and size > pinned_fails_above:
                raise RuntimeError("CUDA error: out of memory\nCUDA kernel errors ...")
        return real_torch.empty(size, dtype=dtype)

    class Device:
        def __init__(self, kind: str, index: int | None = None) -> None:
            self.type, self.index = kind, index

        def __str__(self) -> str:
            return f"{self.type}:{self.index}"

    def synchronize() -> None:
        calls["synchronize"] += 1

    def empty_host_cache() -> None:
        calls["empty_host_cache"] += 1

    fake.empty = empty
    fake.device = Device
    fake.cuda = types.SimpleNamespace(
        Event=FakeEvent,
        synchronize=synchronize,
        device_count=lambda: device_count,
        init=lambda: None,
        is_available=lambda: device_count > 0,
        current_device=lambda: 0,
        empty_cache=lambda: None,
        get_device_properties=lambda d: types.SimpleNamespace(
            name="Fake GPU", uuid="00000000-fake-0000-0000-000000000000"
        ),
        _get_nvml_device_index=lambda d: 0,
    )
    fake.accelerator = types.SimpleNamespace(
        memory=types.SimpleNamespace(empty_host_cache=empty_host_cache)
    )
    fake._C = types.SimpleNamespace()
    return fake


class FakePynvml(types.ModuleType):
    """pynvml with one GPU at bus 0000:18:00.0 whose link trains up under load."""

    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    class NVMLError(Exception):
        pass

    def __init__(self, gen_max: int = 4, width_max: int = 16, gen_load: int = 4) -> None:
        super().__init__("pynvml")
        self.gen_max, self.width_max, self.gen_load = gen_max, width_max, gen_load
        self.gen_calls = 0
        self.initialised = 0

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        assert uuid.startswith("GPU-")
        return "handle0"

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"handle{i}"

    def nvmlDeviceGetPciInfo(self, h: str) -> Any:
        return types.SimpleNamespace(busId=b"00000000:18:00.0")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: str) -> int:
        self.gen_calls += 1
        return 1 if self.gen_calls == 1 else self.gen_load  # idle on the first sample

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: str) -> int:
        return self.width_max

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: str) -> int:
        return self.gen_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: str) -> int:
        return self.width_max

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        return 1000 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 2_000_000
