"""The PCIe link under load: NVML polled from a thread while a copy runs.

NVIDIA GPUs drop their link to a low generation when idle to save power (an idle
H100 reports gen 1), so the generation read by `env` says little: it has to be read
while a copy is in flight. `LinkWatch` samples the current generation and width
every few milliseconds, and NVML's PCIe throughput counters (KB/s over a 20 ms
window each; TX is from the GPU out, RX into the GPU, so a host-to-device copy
shows as RX), until the block ends.

The NVML module is passed in (pynvml, or a fake in tests); nothing here imports it.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starvecheck.core import clocks

# NVML counts throughput in KB/s; nvidia-smi and the NVML headers mean 1024 bytes.
NVML_KB = 1024


@dataclass(frozen=True)
class LinkSample:
    t: float
    gen: int | None
    width: int | None
    tx_kbps: int | None = None
    rx_kbps: int | None = None


@dataclass(frozen=True)
class LinkUnderLoad:
    samples: int
    gen: int | None  # the highest generation seen while loaded
    width: int | None  # the widest width seen while loaded
    gens_seen: tuple[int, ...]
    widths_seen: tuple[int, ...]
    rx_gbps: float | None  # median NVML RX (host to device) while loaded
    tx_gbps: float | None
    errors: dict[str, str] = field(default_factory=dict)


class LinkWatch:
    """Context manager: samples the link in a daemon thread while the block runs.

    A query that fails (NOT_SUPPORTED on some boards, NO_PERMISSION in some
    containers) is recorded once in `errors` and not asked again."""

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        interval_s: float = 0.005,
        throughput: bool = True,
        clock: Callable[[], float] = clocks.perf_counter,
    ) -> None:
        self.nvml, self.handle = nvml, handle
        self.interval_s = interval_s
        self.clock = clock
        self.samples: list[LinkSample] = []
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queries: dict[str, Callable[[], int]] = {
            "gen": lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
            "width": lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
        }
        if throughput:
            self._queries["tx"] = lambda: nvml.nvmlDeviceGetPcieThroughput(
                handle, nvml.NVML_PCIE_UTIL_TX_BYTES
            )
            self._queries["rx"] = lambda: nvml.nvmlDeviceGetPcieThroughput(
                handle, nvml.NVML_PCIE_UTIL_RX_BYTES
            )

    def _ask(self, name: str) -> int | None:
        if name in self.errors:
            return None
        try:
            return int(self._queries[name]())
        except Exception as e:  # NVMLError and anything a broken driver raises
            self.errors[name] = f"{type(e).__name__}: {e}"
            return None

    def sample_once(self) -> LinkSample:
        s = LinkSample(
            self.clock(),
            self._ask("gen"),
            self._ask("width"),
            self._ask("tx") if "tx" in self._queries else None,
            self._ask("rx") if "rx" in self._queries else None,
        )
        self.samples.append(s)
        return s

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            if len(self.errors) == len(self._queries):
                return  # nothing left to ask
            self._stop.wait(self.interval_s)

    def __enter__(self) -> LinkWatch:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="starvecheck-linkwatch")
        self._thread.daemon = True
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            # A throughput query blocks for NVML's 20 ms window; a second is plenty.
            self._thread.join(timeout=1.0)

    def result(self) -> LinkUnderLoad:
        return summarize(self.samples, self.errors)


def summarize(samples: list[LinkSample], errors: dict[str, str] | None = None) -> LinkUnderLoad:
    gens = sorted({s.gen for s in samples if s.gen})
    widths = sorted({s.width for s in samples if s.width})
    rx = [s.rx_kbps for s in samples if s.rx_kbps is not None]
    tx = [s.tx_kbps for s in samples if s.tx_kbps is not None]
    return LinkUnderLoad(
        samples=len(samples),
        gen=gens[-1] if gens else None,
        width=widths[-1] if widths else None,
        gens_seen=tuple(gens),
        widths_seen=tuple(widths),
        rx_gbps=statistics.median(rx) * NVML_KB / 1e9 if rx else None,
        tx_gbps=statistics.median(tx) * NVML_KB / 1e9 if tx else None,
        errors=dict(errors or {}),
    )


def open_device(nvml: Any, uuid: str | None, index: int | None) -> Any:
    """NVML's handle for the GPU torch uses: by UUID (CUDA_VISIBLE_DEVICES may reorder
    or hide devices, so torch's index is not NVML's), else by the index torch maps to.
    Raises whatever NVML raises when neither works."""
    if uuid:
        text = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        try:
            return nvml.nvmlDeviceGetHandleByUUID(text)
        except Exception:
            if index is None:
                raise
    if index is None:
        raise LookupError("neither the GPU's UUID nor its NVML index is known")
    return nvml.nvmlDeviceGetHandleByIndex(index)


def bus_id(nvml: Any, handle: Any) -> str | None:
    try:
        value = nvml.nvmlDeviceGetPciInfo(handle).busId
    except Exception:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def max_link(nvml: Any, handle: Any) -> tuple[int | None, int | None]:
    """The highest generation and width the GPU and its slot support together."""
    out: list[int | None] = []
    for call in (nvml.nvmlDeviceGetMaxPcieLinkGeneration, nvml.nvmlDeviceGetMaxPcieLinkWidth):
        try:
            out.append(int(call(handle)))
        except Exception:
            out.append(None)
    return out[0], out[1]
