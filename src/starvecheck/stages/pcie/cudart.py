"""The reference copy: the CUDA runtime called directly through ctypes, no torch.

The same pinned host-to-device copy as starvecheck's, made with cudaMallocHost,
cudaMalloc and cudaMemcpy, and timed the same two ways (CUDA events, and the wall
clock around the blocking call), so a user sees whether torch adds overhead. The
runtime is the one torch has already loaded (found in /proc/self/maps), else the one
its CUDA build brings (the nvidia-cuda-runtime wheel: site-packages/nvidia/cuda_runtime
or nvidia/cu13, or torch/lib), else whatever the dynamic loader finds. It shares the
device's primary context with torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from collections.abc import Callable, Iterable, Sequence

from starvecheck.core import clocks
from starvecheck.stages.pcie.bandwidth import gbps

CUDA_MEMCPY_HOST_TO_DEVICE = 1  # cudaMemcpyKind


class CudartUnavailable(Exception):
    """The runtime library could not be loaded or used; str() is the reason."""


def loaded(maps: str) -> list[str]:
    """The libcudart files this process has mapped (torch loaded its own when CUDA
    started): the very runtime torch copies with, whatever its wheel's layout."""
    found = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, path
        path = fields[5] if len(fields) == 6 else ""
        if os.path.basename(path).startswith("libcudart") and ".so" in path:
            found.append(path)
    return list(dict.fromkeys(found))


def _maps() -> str:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def candidates(
    search_dirs: Iterable[str],
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
    maps: str = "",
) -> list[str]:
    """libcudart paths to try, best first: the one this process already has mapped
    (`maps`, /proc/self/maps' text), the wheel's (CUDA 12's nvidia/cuda_runtime,
    CUDA 13's nvidia/cu13), torch's own copy, then the loader's
    (`ctypes.util.find_library`)."""
    found: list[str] = loaded(maps)
    for base in search_dirs:
        for pattern in (
            os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so*"),
            os.path.join(base, "nvidia", "cu*", "lib", "libcudart.so*"),
            os.path.join(base, "torch", "lib", "libcudart*.so*"),
        ):
            found += sorted(glob.glob(pattern), reverse=True)  # .so.12 before .so.11
    name = find_library("cudart")
    if name:
        found.append(name)
    return list(dict.fromkeys(found))


def site_dirs() -> list[str]:
    import site
    import sys

    dirs = [*getattr(site, "getsitepackages", list)(), site.getusersitepackages()]
    return [d for d in dict.fromkeys(dirs + sys.path) if d and os.path.isdir(d)]


def load(paths: Sequence[str]) -> tuple[ctypes.CDLL, str]:
    errors = []
    for path in paths:
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    if not paths:
        raise CudartUnavailable(
            "libcudart not found (no nvidia/cuda_runtime wheel, none in torch/lib, "
            "none on the loader's path)"
        )
    raise CudartUnavailable("libcudart could not be loaded: " + "; ".join(errors))


class Runtime:
    """The handful of runtime calls the reference needs, each checked."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib, self.path = lib, path
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaMallocHost.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaFreeHost.argtypes = [ctypes.c_void_p]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaEventElapsedTime.argtypes = [
            ctypes.POINTER(ctypes.c_float),
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.cudaEventDestroy.argtypes = [ctypes.c_void_p]
        lib.cudaDeviceSynchronize.argtypes = []

    def check(self, status: int, what: str) -> None:
        if status != 0:
            message = self.lib.cudaGetErrorString(status)
            text = message.decode() if message else f"error {status}"
            raise CudartUnavailable(f"{what} failed: {text} ({status})")

    def event(self) -> ctypes.c_void_p:
        ev = ctypes.c_void_p()
        self.check(self.lib.cudaEventCreate(ctypes.byref(ev)), "cudaEventCreate")
        return ev


def reference_h2d(
    device: int, size: int, warmup: int, runs: int
) -> tuple[list[float], list[float], str]:
    """Pinned host-to-device copies of `size` bytes: (wall-clock GB/s per run, event
    GB/s per run, the library's path). Every buffer and event is freed on the way out."""
    lib, path = load(candidates(site_dirs(), maps=_maps()))
    rt = Runtime(lib, path)
    rt.check(lib.cudaSetDevice(device), "cudaSetDevice")
    host, dev = ctypes.c_void_p(), ctypes.c_void_p()
    start = stop = None
    wall: list[float] = []
    events: list[float] = []
    try:
        rt.check(lib.cudaMallocHost(ctypes.byref(host), size), f"cudaMallocHost({size})")
        rt.check(lib.cudaMalloc(ctypes.byref(dev), size), f"cudaMalloc({size})")
        ctypes.memset(host, 1, size)  # touch every page before timing, as torch's fill does
        start, stop = rt.event(), rt.event()
        elapsed_ms = ctypes.c_float()
        for i in range(warmup + runs):
            rt.check(lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
            t0 = clocks.perf_counter()
            rt.check(lib.cudaEventRecord(start, None), "cudaEventRecord")
            rt.check(lib.cudaMemcpy(dev, host, size, CUDA_MEMCPY_HOST_TO_DEVICE), "cudaMemcpy")
            rt.check(lib.cudaEventRecord(stop, None), "cudaEventRecord")
            rt.check(lib.cudaEventSynchronize(stop), "cudaEventSynchronize")
            t1 = clocks.perf_counter()
            rt.check(
                lib.cudaEventElapsedTime(ctypes.byref(elapsed_ms), start, stop),
                "cudaEventElapsedTime",
            )
            if i >= warmup:
                wall.append(gbps(size, t1 - t0))
                events.append(gbps(size, max(elapsed_ms.value, 1e-6) / 1e3))
    finally:
        for ev in (start, stop):
            if ev is not None:
                lib.cudaEventDestroy(ev)
        if dev.value:
            lib.cudaFree(dev)
        if host.value:
            lib.cudaFreeHost(host)
    return wall, events, path
