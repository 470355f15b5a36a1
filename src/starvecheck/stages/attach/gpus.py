"""The job's GPUs, as NVML sees them, over the seconds `attach` reads: each GPU's
utilization once a second (NVML's `utilization.gpu`: the share of its last sample
period in which a kernel ran).

Which GPUs are the job's:
  1. the GPUs whose running compute processes include one of the job's PIDs;
  2. where none does (in a container NVML lists the host's PIDs, which this namespace
     does not share), the ones the job's CUDA_VISIBLE_DEVICES names, by index or UUID;
  3. else every GPU, and the report says the choice was not the job's own.

Only a job that has the CUDA driver library mapped (libcuda.so in /proc/PID/maps) is
looked for on a GPU: a CPU job gets no NVML call and no caveat. NVML is only read;
nothing is set on any device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from starvecheck.probe import process
from starvecheck.probe.nvml import NvmlUnavailable, session
from starvecheck.probe.sysroot import SysRoot


def uses_cuda(pid: int) -> bool:
    """Whether the process has the CUDA driver library mapped (read bounded)."""
    return process.maps_hold(SysRoot.from_environ(), pid, "libcuda.so") is True


def visible_devices(pid: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES of the process, split; None where unset or unreadable."""
    val = (process.environ(SysRoot.from_environ(), pid) or {}).get("CUDA_VISIBLE_DEVICES")
    return None if val is None else [x.strip() for x in val.split(",") if x.strip()]


@dataclass
class Gpu:
    index: int
    handle: Any
    name: str | None
    uuid: str | None
    job_pids: list[int] = field(default_factory=list)
    other_pids: list[int] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)


class GpuWatch:
    """Opens NVML for the length of the read (`close` shuts it); `gpus` are the job's,
    `chosen_by` says how they were told, `reason` why none are read."""

    def __init__(
        self,
        pids: Iterable[int],
        nvml: Callable[[], contextlib.AbstractContextManager[Any]] = session,
        cuda: Callable[[int], bool] = uses_cuda,
        visible: Callable[[int], list[str] | None] = visible_devices,
    ) -> None:
        self.pids = sorted(set(pids))
        self.gpus: list[Gpu] = []
        self.chosen_by = ""
        self.reason: str | None = None
        self.missing = False  # CUDA in use, yet NVML gave nothing: a caveat
        self._stack = contextlib.ExitStack()
        self._nv: Any = None
        if not any(cuda(p) for p in self.pids):
            self.reason = "the job has no CUDA driver library loaded: it uses no GPU"
            return
        try:
            self._nv = self._stack.enter_context(nvml())
            self._find(visible)
        except NvmlUnavailable as e:
            self._fail(f"NVML cannot be opened: {e}")
        except Exception as e:  # NVMLError from a query: the reason, in one line
            self._fail(f"NVML: {' '.join(str(e).split())}")

    def _fail(self, why: str) -> None:
        self.reason, self.missing, self.gpus = why, True, []
        self.close()

    def _find(self, visible: Callable[[int], list[str] | None]) -> None:
        nv = self._nv
        every: list[Gpu] = []
        for i in range(int(nv.nvmlDeviceGetCount())):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            gpu = Gpu(i, h, _try(lambda h=h: _str(nv.nvmlDeviceGetName(h))),
                      _try(lambda h=h: _str(nv.nvmlDeviceGetUUID(h))))  # fmt: skip
            running = _try(lambda h=h: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []
            for p in running:
                pid = int(getattr(p, "pid", -1))
                (gpu.job_pids if pid in self.pids else gpu.other_pids).append(pid)
            every.append(gpu)
        ours = [g for g in every if g.job_pids]
        if ours:
            self.gpus, self.chosen_by = ours, "the job's PIDs among each GPU's processes"
            return
        names = next((v for p in self.pids if (v := visible(p)) is not None), None)
        if names:
            named = [g for g in every if str(g.index) in names or (g.uuid or "-") in names]
            if named:
                self.gpus, self.chosen_by = named, "the job's CUDA_VISIBLE_DEVICES"
                return
        self.gpus = every
        self.chosen_by = (
            "every GPU: NVML lists none of the job's PIDs (a container's PIDs are not the "
            "host's) and CUDA_VISIBLE_DEVICES does not name them"
        )
        if not every:
            self._fail("NVML sees no GPU")

    def tick(self) -> None:
        for g in self.gpus:
            rates = _try(lambda g=g: self._nv.nvmlDeviceGetUtilizationRates(g.handle))
            if rates is not None:
                g.utilization.append(float(rates.gpu))

    def close(self) -> None:
        self._stack.close()


def _try(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # NOT_SUPPORTED, NO_PERMISSION on one query: leave it out
        return None


def _str(x: Any) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else str(x)
