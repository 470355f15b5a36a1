"""A trace file's events sorted out in one pass: each process's host events (profiler
steps, DataLoader fetches, the loop's phases, host collectives) and each GPU device's
(kernels, copies by direction, memsets, collectives), and which process drives which
device (the correlation ids of its runtime calls)."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starvecheck.stages.trace import hta
from starvecheck.stages.trace.intervals import Interval
from starvecheck.stages.trace.load import Event, span
from starvecheck.stages.trainstep import PHASES

GPU_KERNEL = "kernel"
GPU_MEMCPY = "gpu_memcpy"
GPU_MEMSET = "gpu_memset"
# Kineto before PyTorch 1.9 spelt the GPU categories "Kernel", "Memcpy", "Memset".
GPU_CATEGORIES = {
    "kernel": GPU_KERNEL,
    "gpu_memcpy": GPU_MEMCPY,
    "memcpy": GPU_MEMCPY,
    "gpu_memset": GPU_MEMSET,
    "memset": GPU_MEMSET,
}
# Device activity starvecheck does not time, and why (the GPU figures say so, rather
# than calling the run CPU-only).
UNTIMED_DEVICES = {
    "mtia_ccp_events": "an MTIA trace: its device events are not kernels starvecheck can "
    "time, so GPU figures are not measured",
    "cuda_profiler_range": "a CUPTI range-profiler trace (kernels replayed to count "
    "events, not run as in training): GPU figures are not measured",
}
NO_GPU = "no GPU kernels in the trace: a CPU-only run"
_STEP = re.compile(r"ProfilerStep#(\d+)")
_FETCH_PREFIX = "enumerate(DataLoader)#"
_COPY = re.compile(r"Memcpy\s*(HtoD|DtoH|DtoD|PtoP|HtoH)", re.IGNORECASE)
_COPY_KIND = {"htod": "h2d", "dtoh": "d2h", "dtod": "d2d", "ptop": "d2d"}


def _category(cat: Any) -> str:
    return cat.lower() if isinstance(cat, str) else ""


def _is_fetch(name: str) -> bool:
    return name.startswith(_FETCH_PREFIX) and "__next__" in name


def copy_kind(name: str) -> tuple[str | None, bool]:
    """(h2d, d2h, d2d or None, from pageable host memory) from Kineto's copy name,
    "Memcpy HtoD (Pageable -> Device)"; ROCm writes "(Host -> Device)", pinned or not."""
    m = _COPY.search(name)
    kind = _COPY_KIND.get(m.group(1).lower()) if m else None
    return kind, kind == "h2d" and "(pageable" in name.lower()


def is_collective(name: str) -> bool:
    """A collective's kernel: NCCL's (ncclKernel_*, ncclDevKernel_*) or RCCL's."""
    low = name.lower()
    return "nccl" in low or "rccl" in low


# A collective run on the host: c10d's CPU backends record each one as a range on their
# own thread ("gloo:all_reduce"), which lasts until every rank has joined. NCCL's host
# ranges ("nccl:all_reduce") only enqueue: its waits are the GPU kernels above.
HOST_COLLECTIVE_PREFIXES = ("gloo:", "mpi:", "ucc:")


@dataclass
class Device:
    """One device's GPU events, sorted out."""

    busy: list[Interval] = field(default_factory=list)
    copies: dict[str, list[Interval]] = field(default_factory=lambda: defaultdict(list))
    pageable: list[Interval] = field(default_factory=list)
    collectives: list[Interval] = field(default_factory=list)
    # Per stream, every GPU event (start, end, correlation id): HTA's idle split.
    streams: dict[Any, list[hta.Launch]] = field(default_factory=lambda: defaultdict(list))
    launches: list[Any] = field(default_factory=list)  # correlation ids, to find its process


@dataclass
class Process:
    """One process's host events that the figures read."""

    steps: list[tuple[str, Interval]] = field(default_factory=list)
    fetches: list[Interval] = field(default_factory=list)
    phases: dict[str, list[Interval]] = field(default_factory=lambda: defaultdict(list))
    iterators: Counter[str] = field(default_factory=Counter)
    launched: dict[Any, float] = field(default_factory=dict)  # correlation id -> host call start
    collectives: list[Interval] = field(default_factory=list)  # on the host (gloo, MPI, UCC)

    def absorb(self, other: Process) -> None:
        """Take another process's fetches, phases and host collectives (its steps and
        launches stay)."""
        self.fetches += other.fetches
        self.collectives += other.collectives
        self.iterators.update(other.iterators)
        for ph, r in other.phases.items():
            self.phases[ph] += r


@dataclass
class Sorted:
    processes: dict[Any, Process]
    devices: dict[Any, Device]
    untimed: str | None  # why device activity is not timed, where the trace has such
    lo: float
    hi: float


def sort_events(events: Iterable[Event]) -> Sorted:
    """One pass over a file's events: hot, so kept lean."""
    processes: dict[Any, Process] = defaultdict(Process)
    devices: dict[Any, Device] = defaultdict(Device)
    untimed = None
    lo, hi = math.inf, -math.inf
    phase_names = set(PHASES)
    for e in events:
        sp = span(e)
        if sp is None:
            continue
        if sp[0] < lo:
            lo = sp[0]
        if sp[1] > hi:
            hi = sp[1]
        category = _category(e.cat)
        kind = GPU_CATEGORIES.get(category)
        name = e.name if isinstance(e.name, str) else ""
        if kind is not None:
            d = devices[_key(e.pid)]
            d.busy.append(sp)
            corr = e.args.correlation if e.args is not None else None
            if e.tid != -1:
                d.streams[_key(e.tid)].append((sp[0], sp[1], corr))
            if kind == GPU_KERNEL:
                if is_collective(name):
                    d.collectives.append(sp)
            elif kind == GPU_MEMCPY:
                what, pageable = copy_kind(name)
                d.copies[what or "other"].append(sp)
                if pageable:
                    d.pageable.append(sp)
            if corr is not None:
                d.launches.append(corr)
            continue
        if category.startswith("gpu_"):  # gpu_user_annotation: the host's ranges, copied
            continue
        if e.args is not None and e.args.correlation is not None:  # a runtime call
            processes[_key(e.pid)].launched[e.args.correlation] = sp[0]
            continue
        if category in UNTIMED_DEVICES:
            untimed = UNTIMED_DEVICES[category]
            continue
        if name.startswith("ProfilerStep#"):
            if _STEP.fullmatch(name) and sp[1] > sp[0]:  # zero length: nothing to share out
                processes[_key(e.pid)].steps.append((name, sp))
        elif _is_fetch(name):
            p = processes[_key(e.pid)]
            p.fetches.append(sp)
            p.iterators[name[len(_FETCH_PREFIX) :].split(".", 1)[0]] += 1
        elif name in phase_names:
            processes[_key(e.pid)].phases[name].append(sp)
        elif name.startswith(HOST_COLLECTIVE_PREFIXES):
            processes[_key(e.pid)].collectives.append(sp)
    return Sorted(dict(processes), dict(devices), untimed, lo, hi)


def _key(pid: Any) -> Any:
    """A pid or device id usable as a key (JSON may hold any type there)."""
    return pid if isinstance(pid, int | float | str) and not isinstance(pid, bool) else repr(pid)


def device_owners(
    processes: Mapping[Any, Process], devices: Mapping[Any, Device]
) -> dict[Any, Any]:
    """device -> the process (of `processes`) that launched most of its work, by the
    correlation ids of its runtime calls. Ids are per process and can repeat across
    the ranks of a merged file; an id that more than one process holds casts no vote."""
    holders: dict[Any, list[Any]] = defaultdict(list)
    for pid, p in processes.items():
        for corr in p.launched:
            holders[corr].append(pid)
    out = {}
    for dev, d in devices.items():
        votes: Counter[Any] = Counter()
        for corr in d.launches:
            h = holders.get(corr)
            if h is not None and len(h) == 1:
                votes[h[0]] += 1
        if votes:
            out[dev] = votes.most_common(1)[0][0]
    return out


# ---------------------------------------------------------------------------------
# Per step, per device
