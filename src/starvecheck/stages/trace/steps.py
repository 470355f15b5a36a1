"""One rank's steps: its intervals merged into a timeline, cut into profiler steps,
and the rules that leave a warm-up first step and a stub last step out."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starvecheck.stages.trace.events import Device, Process
from starvecheck.stages.trace.intervals import Cover, intersect, union
from starvecheck.stages.trainstep import PHASES

WARMUP_MIN_STEPS = 3  # a warm-up step is left out only when two or more others remain
STUB_SHARE = 0.10  # a last step under this share of the others' median is the profiler closing


@dataclass(frozen=True)
class DeviceStep:
    """One device's figures in one step, in microseconds."""

    busy: float
    idle_data_wait: float  # idle that overlaps a data fetch: starvecheck's split
    copies: Mapping[str, float]  # h2d, d2h, d2d (and other), and h2d_pageable
    collectives: float
    memcpy: float  # copies of every kind, their union: two at once count once


@dataclass(frozen=True)
class Step:
    """One profiler step's figures, in microseconds."""

    name: str
    start: float
    dur: float
    data_wait: float
    phases: Mapping[str, float] = field(default_factory=dict)  # phase -> time in the step
    devices: Mapping[Any, DeviceStep] = field(default_factory=dict)
    host_collectives: float = 0.0  # a CPU backend's (gloo's) collectives in the step

    def collectives(self) -> float:
        return max([self.host_collectives, *(d.collectives for d in self.devices.values())])

    @property
    def work(self) -> float:
        """The step less the time its GPUs spent in collectives: in synchronous
        training the fast ranks wait there for the slow one."""
        return self.dur - self.collectives()


@dataclass(frozen=True)
class Timeline:
    """One rank's intervals of each kind, merged (sorted and disjoint), each with its
    running total: a step's share of any kind is two bisections (intervals.Cover),
    so the steps cost O(steps x log events) however much they overlap."""

    wait: Cover  # DataLoader fetches and DATALOADER_WAIT ranges
    source: str | None  # which of the two the trace holds; None: neither
    phases: dict[str, Cover]  # the loop's phases present, in loop order
    devices: dict[Any, Merged]
    iterators: Counter[str]
    host_collectives: Cover


@dataclass(frozen=True)
class Merged:
    busy: Cover
    copies: dict[str, Cover]
    collectives: Cover
    memcpy: Cover
    busy_waiting: Cover  # busy while the loop waits for data


def timeline(p: Process, devices: Mapping[Any, Device]) -> Timeline:
    waits = p.phases.get("DATALOADER_WAIT", [])
    # The loop's own DATALOADER_WAIT wraps next(iterator): PyTorch's fetch and the
    # Python around it. Where both exist, the union takes the wider.
    names = [
        n for n, found in (("DATALOADER_WAIT", waits), ("DataLoader.__next__", p.fetches)) if found
    ]
    wait = union(p.fetches + waits)
    merged = {}
    for dev, d in sorted(devices.items(), key=lambda kv: repr(kv[0])):
        copies = {k: Cover(union(v)) for k, v in d.copies.items()}
        copies["h2d_pageable"] = Cover(union(d.pageable))
        every = [iv for k, v in d.copies.items() for iv in v]
        busy = union(d.busy)
        merged[dev] = Merged(
            Cover(busy),
            copies,
            Cover(union(d.collectives)),
            Cover(union(every)),
            Cover(intersect(wait, busy)),
        )
    return Timeline(
        wait=Cover(wait),
        source=" and ".join(names) or None,
        phases={ph: Cover(union(p.phases[ph])) for ph in PHASES if p.phases.get(ph)},
        devices=merged,
        iterators=p.iterators,
        host_collectives=Cover(union(p.collectives)),
    )


def measure(name: str, lo: float, hi: float, t: Timeline) -> Step:
    """One step's figures: every kind of interval cut to [lo, hi)."""
    waited = t.wait.within(lo, hi)
    devices = {}
    for dev, d in t.devices.items():
        devices[dev] = DeviceStep(
            busy=d.busy.within(lo, hi),
            # Idle while waiting: the wait, less the part of it the GPU was busy anyway.
            idle_data_wait=max(0.0, waited - d.busy_waiting.within(lo, hi)),
            copies={k: v.within(lo, hi) for k, v in d.copies.items()},
            collectives=d.collectives.within(lo, hi),
            memcpy=d.memcpy.within(lo, hi),
        )
    return Step(
        name=name,
        start=lo,
        dur=hi - lo,
        data_wait=waited,
        phases={p: r.within(lo, hi) for p, r in t.phases.items()},
        devices=devices,
        host_collectives=t.host_collectives.within(lo, hi),
    )


def warmup_steps(steps: Sequence[Step]) -> int:
    """1 when the first step is the profiler's very first (ProfilerStep#0) and at least
    two others follow: start-up lands there (CUDA context, workers starting, cuDNN
    autotuning, the profiler's own start). A trace that starts at a later step came
    from a schedule with wait or warmup steps, which were that warm-up already."""
    return int(len(steps) >= WARMUP_MIN_STEPS and steps[0].name == "ProfilerStep#0")


def stub_steps(steps: Sequence[Step], warmup: int) -> int:
    """1 when the last step is a stub: under a tenth of the others' median, as the
    profiler's closing step is (it stops the profiler, and trains nothing). A short
    last step in which the loop fetched data or ran a phase, as the others did, is a
    real step that happened to be fast (the data was ready), and stays."""
    rest = steps[warmup:]
    if len(rest) < 2:
        return 0
    median = statistics.median(s.dur for s in rest[:-1])
    last = rest[-1]
    if last.dur >= STUB_SHARE * median:
        return 0

    def worked(s: Step) -> bool:
        return s.data_wait > 0 or any(v > 0 for v in s.phases.values())

    return int(not (worked(last) and any(worked(s) for s in rest[:-1])))
