"""The CUDA side of `pcie`: host <-> device copies through torch, timed two ways.

Every copy is timed by CUDA events recorded around it and by the wall clock around
it with `torch.cuda.synchronize()` on both sides. Events time the device's work
only; a copy from pageable memory also costs the CPU staging it through a pinned
bounce buffer, which only the wall clock sees, and the Python thread of a training
loop waits for that too. The wall clock is the headline figure for that reason.

Only the stage (stages/pcie.py) calls this module, and only when a CUDA device is
there; the arithmetic lives in stages/bandwidth.py.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.signals import check_signals
from starvecheck.stages.pcie.bandwidth import Overlap, calibrate, gbps, spin

# The CPU work of the overlap experiment lasts at least this long, and as long as
# the copy alone where that is longer, so neither hides the other by size alone.
CPU_WORK_S = 5e-3
CPU_WORK_MAX_S = 0.25


@dataclass(frozen=True)
class Timings:
    wall_gbps: list[float]
    event_gbps: list[float]


class Failed(Exception):
    """One measurement could not be made (allocation refused, CUDA error); str() says why."""


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def time_copy(
    torch: Any,
    copy: Callable[[], object],
    nbytes: int,
    warmup: int,
    runs: int,
    events: bool = True,
) -> Timings:
    """`copy` timed `runs` times after `warmup` unmeasured runs."""
    sync = torch.cuda.synchronize
    start = torch.cuda.Event(enable_timing=True) if events else None
    stop = torch.cuda.Event(enable_timing=True) if events else None
    wall: list[float] = []
    ev: list[float] = []
    for i in range(warmup + runs):
        check_signals()
        sync()
        t0 = clocks.perf_counter()
        if start is not None:
            start.record()
        copy()
        if stop is not None:
            stop.record()
        sync()
        t1 = clocks.perf_counter()
        if i < warmup:
            continue
        wall.append(gbps(nbytes, t1 - t0))
        if start is not None and stop is not None:
            ms = start.elapsed_time(stop)
            ev.append(gbps(nbytes, max(ms, 1e-6) / 1e3))
    return Timings(wall, ev)


@dataclass
class Buffers:
    device: Any
    pinned: Any | None
    pageable: Any
    pinned_error: str | None

    def drop(self) -> None:
        """Let go of the tensors, so `release` can hand their memory back."""
        self.device = self.pinned = self.pageable = None


def allocate(torch: Any, size: int, device: Any, pinned: bool = True) -> Buffers:
    """The three buffers of one size, every page written once (a pageable buffer's pages
    are not there until touched, and the first touch is no part of a copy)."""
    try:
        dev = torch.empty(size, dtype=torch.uint8, device=device)
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        raise Failed(f"device buffer of {size} bytes: {_one_line(e)}") from e
    dev.fill_(1)
    pageable = torch.empty(size, dtype=torch.uint8)
    pageable.fill_(2)
    host, err = None, None
    if pinned:
        try:
            host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            host.fill_(3)
        except RuntimeError as e:
            err = f"pinned allocation of {size} bytes failed: {_one_line(e)}"
    return Buffers(dev, host, pageable, err)


def release(torch: Any) -> None:
    """Hand cached device memory and cached pinned host memory back, so one size's
    buffers do not stay pinned while the next is measured (torch's host allocator
    keeps freed pinned blocks for reuse)."""
    torch.cuda.empty_cache()
    accelerator = getattr(torch, "accelerator", None)
    for owner, name in (
        (accelerator, "empty_host_cache"),
        (getattr(accelerator, "memory", None), "empty_host_cache"),
        (torch._C, "_host_emptyCache"),
    ):
        fn = getattr(owner, name, None)
        if fn is not None:
            fn()
            return


def sweep_size(
    torch: Any, size: int, device: Any, warmup: int, runs: int
) -> tuple[dict[str, Timings], str | None]:
    """Every copy of one size, keyed "<direction>.<memory>[.fresh]", and why the pinned
    ones are missing (None when they were measured)."""
    b = allocate(torch, size, device)
    pinned_error = b.pinned_error
    out: dict[str, Timings] = {}

    def run(key: str, copy: Callable[[], object], events: bool = True) -> None:
        out[key] = time_copy(torch, copy, size, warmup, runs, events=events)

    try:
        run("h2d.pageable", lambda: b.device.copy_(b.pageable))
        run("d2h.pageable", lambda: b.pageable.copy_(b.device))
        # `.to("cpu")` as checkpointing and logging do: a fresh pageable buffer each
        # time, its pages faulted in during the copy.
        run("d2h.pageable.fresh", lambda: b.device.to("cpu"), events=False)
        if b.pinned is not None:
            run("h2d.pinned", lambda: b.device.copy_(b.pinned))
            run("d2h.pinned", lambda: b.pinned.copy_(b.device))
    finally:
        b.drop()
        release(torch)
    return out, pinned_error


def overlap(
    torch: Any, size: int, device: Any, pinned: bool, non_blocking: bool, warmup: int, runs: int
) -> tuple[Overlap, list[float], list[float], list[float]]:
    """The copy alone, the calibrated CPU work alone, and both: the copy issued first,
    then the CPU work, then a synchronize. Returns the medians and the raw seconds, the
    three lists aligned by round.

    The three are interleaved, one of each per round, so a drift in the link or the CPU
    (a pageable 256 MiB copy varied from 3.9 to 8.6 GB/s on a lent H100) hits all three
    alike; measured one after the other, such a drift once read as 69% overlap for a
    pageable blocking copy that another run put at 0%. Each round gives its own ratio."""
    b = allocate(torch, size, device, pinned=pinned)
    if pinned and b.pinned is None:
        raise Failed(b.pinned_error or "pinned allocation failed")
    src = b.pinned if pinned else b.pageable
    sync = torch.cuda.synchronize

    def once(fn: Callable[[], object]) -> float:
        check_signals()
        sync()
        t0 = clocks.perf_counter()
        fn()
        sync()
        return clocks.perf_counter() - t0

    def copy() -> None:
        b.device.copy_(src, non_blocking=non_blocking)

    for _ in range(warmup):
        once(copy)
    target = min(CPU_WORK_MAX_S, max(CPU_WORK_S, once(copy)))
    n = calibrate(target)

    def both() -> None:
        b.device.copy_(src, non_blocking=non_blocking)
        spin(n)

    cpu_s: list[float] = []
    copy_s: list[float] = []
    both_s: list[float] = []
    for i in range(warmup + runs):
        times = (once(copy), once(lambda: spin(n)), once(both))
        if i >= warmup:
            for values, t in zip((copy_s, cpu_s, both_s), times, strict=True):
                values.append(t)
    b.drop()
    release(torch)
    med = Overlap(statistics.median(cpu_s), statistics.median(copy_s), statistics.median(both_s))
    return med, cpu_s, copy_s, both_s


def under_load(torch: Any, size: int, device: Any, seconds: float, watch: Any) -> float:
    """Back-to-back pinned host-to-device copies for about `seconds` while `watch`
    (a LinkWatch) samples the link; returns the GB/s over the whole window."""
    b = allocate(torch, size, device)
    if b.pinned is None:
        raise Failed(b.pinned_error or "pinned allocation failed")
    b.device.copy_(b.pinned)  # wake the link before the window opens
    torch.cuda.synchronize()
    copies = 0
    with watch:
        t0 = clocks.perf_counter()
        while clocks.perf_counter() - t0 < seconds or copies < 2:
            check_signals()
            b.device.copy_(b.pinned, non_blocking=True)
            copies += 1
            if copies % 4 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        elapsed = clocks.perf_counter() - t0
    b.drop()
    release(torch)
    return gbps(size * copies, elapsed)


@contextmanager
def bound_to(cpus: frozenset[int]) -> Iterator[None]:
    """This thread on `cpus` for the block (pid 0 is the calling thread), then back."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def numa_h2d(
    torch: Any, size: int, device: Any, cpus: frozenset[int], warmup: int, runs: int
) -> list[float]:
    """Pinned H2D GB/s with the copying thread bound to `cpus`; the pinned buffer is
    allocated and first touched after binding, so its pages land on that node."""
    try:
        with bound_to(cpus):
            b = allocate(torch, size, device)
            if b.pinned is None:
                raise Failed(b.pinned_error or "pinned allocation failed")
            t = time_copy(torch, lambda: b.device.copy_(b.pinned), size, warmup, runs, events=False)
            b.drop()
            release(torch)
    except OSError as e:  # EINVAL: the cpuset of this cgroup excludes these CPUs
        raise Failed(f"cannot bind to CPUs: {e.strerror or e}") from e
    return t.wall_gbps
