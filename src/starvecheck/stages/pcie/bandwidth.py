"""The arithmetic of `pcie`, apart from any CUDA call, so tests check it on a CPU.

Size names, GB/s, the overlap ratio, the calibration of CPU work,
the host-memory budget that decides which sizes can be pinned, and the choice of
NUMA nodes. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starvecheck.core import clocks
from starvecheck.core.units import size_name as size_name
from starvecheck.probe.gpu import theoretical_gbps  # one table for env and pcie
from starvecheck.stages.options import PcieOptions

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_SIZES = PcieOptions.SIZES[False]
QUICK_SIZES = PcieOptions.SIZES[True]
# The size the reference comparison and overlap figures are stated at.
REFERENCE_SIZE = 256 * MiB
MAX_SIZE = 16 * GiB
MIN_SIZE = 4 * KiB


# Below this gap between the sequential and the ideal parallel time, the ratio is a
# quotient of noise: one of the two is too short next to the other to say.
MIN_OVERLAP_GAP_S = 0.5e-3

# Host buffers one size needs at once: a pinned buffer, a pageable one, and the fresh
# pageable destination of a D2H copy (`.to("cpu")` allocates it).
HOST_COPIES = 3
# Pinned pages cannot be swapped or reclaimed: use at most this share of the memory
# the process may still take, so the measurement never pushes the job into the OOM
# killer or the cgroup limit.
HEADROOM_SHARE = 0.5


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal GB/s (10^9 bytes per second), the unit PCIe links are specified in."""
    if seconds <= 0:
        raise ValueError("a copy cannot take no time")
    return nbytes / seconds / 1e9


def runs_for(size: int, runs: int, warmup: int) -> tuple[int, int]:
    """(warm-ups, measured runs) for one size: a 1 GiB copy takes tens of ms and is
    stable, so sizes above REFERENCE_SIZE get half the runs (at least 3) and one warm-up."""
    if size > REFERENCE_SIZE:
        return min(warmup, 1), max(3, runs // 2)
    return warmup, runs


@dataclass(frozen=True)
class Overlap:
    cpu_s: float  # the CPU work alone
    copy_s: float  # the copy alone
    both_s: float  # the copy issued, then the CPU work, then a synchronize

    @property
    def sequential_s(self) -> float:
        return self.cpu_s + self.copy_s

    @property
    def parallel_s(self) -> float:
        """The ideal: the longer of the two hides the other."""
        return max(self.cpu_s, self.copy_s)

    @property
    def ratio(self) -> float | None:
        """(sequential - both) / (sequential - parallel), clamped to 0..1; None when
        the shorter of the two is too short to tell (see MIN_OVERLAP_GAP_S)."""
        gap = self.sequential_s - self.parallel_s
        if gap < MIN_OVERLAP_GAP_S:
            return None
        # Rounded so a ratio of exactly 0.8 in seconds is 0.8, not 0.7999999999.
        return round(min(1.0, max(0.0, (self.sequential_s - self.both_s) / gap)), 6)


def spin(n: int) -> int:
    """CPU work for the overlap experiment: pure Python arithmetic, so it holds the
    GIL the way a collate function or a Python augmentation does."""
    x = 0
    for i in range(n):
        x = (x + i * i) & 0xFFFF
    return x


def calibrate(
    target_s: float,
    work: Callable[[int], object] = spin,
    clock: Callable[[], float] = clocks.perf_counter,
    start: int = 1000,
    tries: int = 8,
    tolerance: float = 0.1,
) -> int:
    """The iteration count for which `work` takes about `target_s` by `clock`.

    Scales the count by target/elapsed until one run lands within `tolerance`;
    the count grows at most 100-fold per try, so a first run too short to time does
    not overshoot wildly."""
    if target_s <= 0:
        raise ValueError("target must be positive")
    n = max(1, start)
    for _ in range(tries):
        t0 = clock()
        work(n)
        elapsed = clock() - t0
        if elapsed > 0 and abs(elapsed - target_s) <= tolerance * target_s:
            return n
        factor = target_s / elapsed if elapsed > 0 else 100.0
        n = max(1, round(n * min(100.0, factor)))
    return n


def link_peak(gen: int | None, width: int | None) -> float | None:
    """GB/s per direction of a negotiated link (3.0 x16 = 15.76, 4.0 x16 = 31.5, 5.0 x16
    = 63.0), the same table `env` uses (probe.gpu.GEN_LANE_GBPS)."""
    return theoretical_gbps(gen, width)


def efficiency(measured_gbps: float | None, peak_gbps: float | None) -> float | None:
    if measured_gbps is None or not peak_gbps:
        return None
    return measured_gbps / peak_gbps


@dataclass(frozen=True)
class SizePlan:
    """Which sizes the host can afford to pin, and why the others are left out."""

    sizes: tuple[int, ...]
    skipped: tuple[tuple[int, str], ...]
    budget_bytes: int | None  # None: nothing limits it that we could read
    notes: tuple[str, ...] = ()


def headroom(available: int | None, limit: int | None, usage: int | None) -> tuple[int | None, str]:
    """Bytes this process may still take, and where the figure comes from: the lesser
    of MemAvailable and the cgroup's limit minus its usage."""
    candidates: list[tuple[int, str]] = []
    if available is not None:
        candidates.append((available, "MemAvailable"))
    if limit is not None and usage is not None:
        candidates.append((max(0, limit - usage), "the cgroup memory limit minus its usage"))
    elif limit is not None:
        candidates.append((limit, "the cgroup memory limit (usage unknown)"))
    if not candidates:
        return None, "neither MemAvailable nor a cgroup limit could be read"
    return min(candidates)


def plan_sizes(
    sizes: Sequence[int],
    room: int | None,
    room_source: str,
    memlock: int | None,
    memlock_unlimited: bool,
) -> SizePlan:
    """Skip sizes whose host buffers would not fit in HEADROOM_SHARE of the room.

    RLIMIT_MEMLOCK is reported, not enforced: the NVIDIA driver page-locks
    cudaHostAlloc memory itself (torch's pin_memory goes through it), not through
    mlock(2), so the limit does not cap pinned buffers; it does cap RDMA
    registrations (GPUDirect RDMA, NCCL over InfiniBand)."""
    from starvecheck.core.units import format_bytes

    notes: list[str] = []
    budget = int(room * HEADROOM_SHARE) if room is not None else None
    kept, skipped = [], []
    for size in sizes:
        need = HOST_COPIES * size
        if budget is not None and need > budget:
            skipped.append(
                (
                    size,
                    f"needs {format_bytes(need)} of host memory ({HOST_COPIES} buffers), "
                    f"more than half of the {format_bytes(room)} left ({room_source})",
                )
            )
        else:
            kept.append(size)
    if room is None:
        notes.append(f"host memory headroom unknown ({room_source}): no size was checked")
    big = [s for s in kept if memlock is not None and not memlock_unlimited and s > memlock]
    if big:
        notes.append(
            f"RLIMIT_MEMLOCK is {format_bytes(memlock)}, below {size_name(max(big))}: sizes "
            "are pinned anyway, since the NVIDIA driver page-locks cudaHostAlloc memory "
            "without mlock(2); a failed pinned allocation is reported with its error"
        )
    return SizePlan(tuple(kept), tuple(skipped), budget, tuple(notes))


def reference_size(sizes: Sequence[int]) -> int | None:
    """REFERENCE_SIZE when planned, else the largest planned size not above it (the
    largest of all when every size is above it)."""
    if not sizes:
        return None
    if REFERENCE_SIZE in sizes:
        return REFERENCE_SIZE
    below = [s for s in sizes if s <= REFERENCE_SIZE]
    return max(below) if below else min(sizes)


def overlap_size(budget: int | None) -> int | None:
    """The copy size of the overlap experiment, the NUMA comparison and the link under
    load, whatever --sizes says: long enough (REFERENCE_SIZE: 5 ms even at 55 GB/s) for
    the CPU work to be timed against it, halved until its buffers fit the budget."""
    size = REFERENCE_SIZE
    while budget is not None and HOST_COPIES * size > budget:
        size //= 2
        if size < MiB:
            return None
    return size


def other_node(nodes: dict[int, frozenset[int]], local: int) -> int | None:
    """A NUMA node with CPUs other than `local`: the nearest id above, else below."""
    others = sorted(n for n, cpus in nodes.items() if n != local and cpus)
    if not others:
        return None
    above = [n for n in others if n > local]
    return above[0] if above else others[-1]


def remote_penalty(local_gbps: float | None, remote_gbps: float | None) -> float | None:
    """The share of bandwidth lost when the copying thread runs on the other node."""
    if local_gbps is None or remote_gbps is None or local_gbps <= 0:
        return None
    return round(max(0.0, 1.0 - remote_gbps / local_gbps), 6)
