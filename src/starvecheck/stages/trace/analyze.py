"""Step figures of every rank in a set of traces (see the package docstring).

A file's events, sorted into processes and devices (events.py), become per-rank
analyses: each rank's steps (steps.py) with the GPUs it drives, its shares and
caveats. A file that merges several ranks is split by the processes that hold
profiler steps; each GPU device goes to the process that launched its work, so no
figure mixes two ranks. A job is every file's ranks, compared over their common steps.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starvecheck.core.metric import Caveat
from starvecheck.core.status import UsageError
from starvecheck.stages.timing import too_few_runs
from starvecheck.stages.trace import hta
from starvecheck.stages.trace.events import NO_GPU, Device, Process, device_owners, sort_events
from starvecheck.stages.trace.intervals import Cover, intersect, length, union
from starvecheck.stages.trace.load import Deadline, Event, TooSlow, TraceFile, as_events
from starvecheck.stages.trace.steps import (
    STUB_SHARE,
    WARMUP_MIN_STEPS,
    Step,
    Timeline,
    measure,
    stub_steps,
    timeline,
    warmup_steps,
)

AFTER_LAST_STEP = 0.01  # GPU busy time after the last step worth a caveat
# ---------------------------------------------------------------------------------
# One rank


@dataclass(frozen=True)
class Analysis:
    """One rank's (one process's) steps and figures."""

    steps: tuple[Step, ...]  # every step in the trace, in order
    warmup: int  # leading steps left out of the figures (0 or 1)
    whole_trace: bool  # no ProfilerStep events: the trace's span is the one step
    data_wait_source: str | None  # None: no DataLoader fetch in the trace
    dataloader: str | None  # the iterator class, e.g. "_MultiProcessingDataLoaderIter"
    phases: tuple[str, ...]  # starvecheck's phases present, in loop order
    gpu_reason: str | None  # why the GPU figures are None
    devices: tuple[Any, ...]  # the GPU devices this rank drives
    caveats: tuple[Caveat, ...] = ()
    stub: int = 0  # trailing steps left out: the profiler closing (0 or 1)
    name: str = "process"  # "rank 0", "pid 4037", a file's name
    rank: int | None = None
    path: str = ""
    # Per device, HolisticTraceAnalysis's idle split over the whole trace (hta.py).
    hta: Mapping[Any, hta.Split] = field(default_factory=dict)

    @property
    def measured(self) -> tuple[Step, ...]:
        return self.steps[self.warmup : len(self.steps) - self.stub]

    @property
    def step_time(self) -> float:
        return sum(s.dur for s in self.measured)

    def share(self, attr: str) -> float | None:
        """Summed over the measured steps, over their summed time: long steps weigh
        more, as they do in the time a run takes."""
        total = self.step_time
        if not total:
            return None
        return sum(getattr(s, attr) for s in self.measured) / total

    def device_share(self, device: Any, what: Any) -> float | None:
        """A device's figure (`what(DeviceStep)`) summed over the measured steps, over
        their time; None without GPU figures."""
        total = self.step_time
        if self.gpu_reason is not None or device not in self.devices or not total:
            return None
        return sum(what(s.devices[device]) for s in self.measured) / total

    @property
    def device(self) -> Any:
        """The device the rank's headline GPU figures are of: the idlest (a union over
        several would hide an idle GPU behind a busy one)."""
        if not self.devices:
            return None
        return min(self.devices, key=lambda d: self.device_share(d, lambda x: x.busy) or 0.0)

    def gpu(self, what: Any) -> float | None:
        return None if self.device is None else self.device_share(self.device, what)

    @property
    def data_wait_share(self) -> float | None:
        return self.share("data_wait") if self.data_wait_source else None

    @property
    def gpu_idle_share(self) -> float | None:
        busy = self.gpu(lambda d: d.busy)
        return None if busy is None else max(0.0, 1.0 - busy)

    @property
    def gpu_idle_data_wait_share(self) -> float | None:
        return self.gpu(lambda d: d.idle_data_wait) if self.data_wait_source else None

    @property
    def gpu_idle_other_share(self) -> float | None:
        idle, waiting = self.gpu_idle_share, self.gpu_idle_data_wait_share
        return None if idle is None or waiting is None else max(0.0, idle - waiting)

    def copies(self, kind: str) -> float | None:
        return self.gpu(lambda d: d.copies.get(kind, 0.0))

    @property
    def collective_share(self) -> float | None:
        """The GPU's time in collectives; without GPU figures, the host's (gloo's)."""
        if self.device is not None:
            return self.gpu(lambda d: d.collectives)
        if any(s.host_collectives for s in self.measured):
            return self.share("host_collectives")
        return None


def _caveats(a: Analysis, t: Timeline, all_busy: Mapping[Any, Cover]) -> list[Caveat]:
    """Every caveat on a rank's figures: the steps left out or too few, the data wait,
    and the GPUs, in that order."""
    return [*_step_caveats(a), *_wait_caveats(a, t), *_gpu_caveats(a, all_busy)]


def _step_caveats(a: Analysis) -> list[Caveat]:
    """The steps left out (a warm-up, the profiler closing), and too few measured."""
    steps, out = a.steps, []
    if a.warmup:
        out.append(
            Caveat(
                "trace.warmup-left-out",
                f"the first step ({steps[0].name}, {steps[0].dur / 1e3:,.1f} ms) is left out "
                f"as a warm-up; figures are over the other {len(steps) - 1 - a.stub}",
            )
        )
    if a.stub:
        last, others = steps[-1], a.measured
        out.append(
            Caveat(
                "trace.stub-last-step",
                f"the last step ({last.name}, {last.dur / 1e3:,.2f} ms) is left out: under "
                f"{STUB_SHARE:.0%} of the others' median, it is the profiler closing, not a "
                f"training step; figures are over {len(others)}",
            )
        )
    n = len(a.measured)
    if not a.whole_trace and n < WARMUP_MIN_STEPS:
        out.append(
            too_few_runs(
                f"only {n} step{'s' if n != 1 else ''} measured: "
                + ("no spread; " if n == 1 else "")
                + "profile 3 or more (torch.profiler.schedule(active=...))"
            )
        )
    return out


def _wait_caveats(a: Analysis, t: Timeline) -> list[Caveat]:
    """The data wait: no fetch to measure, fetches outside the steps, and what a trace
    with DataLoader workers cannot show."""
    out: list[Caveat] = []
    if t.source is None:
        out.append(
            Caveat(
                "trace.no-dataloader",
                "no DataLoader fetch in the trace (no enumerate(DataLoader)#...__next__ and no "
                "DATALOADER_WAIT range): data wait cannot be measured; wrap the fetch in "
                'torch.profiler.record_function("DATALOADER_WAIT")',
            )
        )
    else:
        # Against the steps' union: steps that overlap cover a fetch once.
        steps = union((s.start, s.start + s.dur) for s in a.steps)
        outside = t.wait.total - length(intersect(t.wait.merged, steps))
        if outside > 0.0005 * t.wait.total:  # more than float rounding
            out.append(
                Caveat(
                    "trace.fetches-outside-steps",
                    f"{outside / 1e3:,.1f} ms of DataLoader fetches fall outside the profiled "
                    "steps and are not counted",
                )
            )
    if t.iterators.get("_MultiProcessingDataLoaderIter"):
        out.append(
            Caveat(
                "trace.main-process-only",
                "with DataLoader workers the trace holds only the main process: the wait is "
                "what the workers did not hide, not what each sample costs them",
            )
        )
    return out


def _gpu_caveats(a: Analysis, all_busy: Mapping[Any, Cover]) -> list[Caveat]:
    """GPU work after the last step (in no step's figures), and a rank that drives
    several GPUs."""
    steps, out = a.steps, []
    if not a.whole_trace and steps:
        end = steps[-1].start + steps[-1].dur
        for dev, busy in all_busy.items():
            total = busy.total
            after = busy.within(end, math.inf)
            if total and after / total > AFTER_LAST_STEP:
                out.append(
                    Caveat(
                        "trace.gpu-after-last-step",
                        f"{after / total:.0%} of GPU {dev}'s busy time ({after / 1e3:,.1f} ms) "
                        f"runs after the last step ({steps[-1].name}) closes and is in no "
                        "step's figures: work launched late, or the profiler stopped while the "
                        "GPU still ran",
                    )
                )
    if len(a.devices) > 1:
        idlest = a.device
        out.append(
            Caveat(
                "trace.several-devices",
                f"{a.name} drives {len(a.devices)} GPUs ({', '.join(map(str, a.devices))}): its "
                f"GPU figures are GPU {idlest}'s, the idlest; each GPU's idle is listed",
            )
        )
    return out


def _analysis(
    name: str,
    p: Process,
    devices: Mapping[Any, Device],
    untimed: str | None,
    whole: tuple[float, float] | None,
    rank: int | None,
    path: str,
    deadline: Deadline,
) -> Analysis:
    caveats = []
    if whole is not None:
        lo, hi = whole
        if not hi > lo or not math.isfinite(hi - lo):
            raise UsageError("the trace's events span no time, or an impossible one")
        step_spans = [("whole trace", (lo, hi))]
        caveats.append(
            Caveat(
                "trace.whole-trace",
                f"no ProfilerStep events (the loop did not call prof.step()): the whole trace, "
                f"{(hi - lo) / 1e3:,.1f} ms, is taken as one step",
            )
        )
    else:
        step_spans = sorted(p.steps, key=lambda s: s[1])
    t = timeline(p, devices)
    steps = []
    for i, (n, (lo, hi)) in enumerate(step_spans):
        if i % 4096 == 0:
            deadline.check(f"analysing {path}")
        steps.append(measure(n, lo, hi, t))
    warmup = warmup_steps(steps)
    gpu_reason = None if any(d.busy for d in t.devices.values()) else (untimed or NO_GPU)
    a = Analysis(
        steps=tuple(steps),
        warmup=warmup,
        whole_trace=whole is not None,
        data_wait_source=t.source,
        dataloader=t.iterators.most_common(1)[0][0] if t.iterators else None,
        phases=tuple(t.phases),
        gpu_reason=gpu_reason,
        devices=tuple(t.devices) if gpu_reason is None else (),
        stub=0 if whole is not None else stub_steps(steps, warmup),
        name=name,
        rank=rank,
        path=path,
        hta={
            dev: hta.split(
                d.streams, p.launched.get, step_spans[-1][1][1] if whole is None else math.inf
            )
            for dev, d in devices.items()
            if gpu_reason is None and dev in t.devices
        },
    )
    busy = {dev: m.busy for dev, m in t.devices.items()}
    return dataclasses.replace(a, caveats=tuple(caveats + _caveats(a, t, busy)))


def analyze_file(
    f: TraceFile, name: str | None = None, deadline: Deadline | None = None
) -> tuple[list[Analysis], list[Caveat]]:
    """Every rank in one file: one Analysis per process that holds profiler steps
    (one for the whole trace where none does)."""
    deadline = deadline or Deadline()
    deadline.check(f"analysing {f.path}")
    s = sort_events(f.events)
    if s.lo == math.inf:
        raise UsageError("the trace has no timed events (complete events with ts and dur)")
    stepped = {pid: p for pid, p in s.processes.items() if p.steps}
    caveats: list[Caveat] = []
    base = name or (f"rank {f.rank}" if f.rank is not None else "process")
    if not stepped:
        merged = Process()
        for p in s.processes.values():
            merged.absorb(p)
        return [
            _analysis(base, merged, s.devices, s.untimed, (s.lo, s.hi), f.rank, f.path, deadline)
        ], caveats
    if len(stepped) == 1:
        ((pid, p),) = stepped.items()
        # Fetches and phases in other processes (threads logged under another pid)
        # belong to the one that steps.
        for other, q in s.processes.items():
            if other != pid:
                p.absorb(q)
        return [_analysis(base, p, s.devices, s.untimed, None, f.rank, f.path, deadline)], caveats
    owners = device_owners(stepped, s.devices)
    unowned = sorted(str(d) for d in s.devices if d not in owners)
    if unowned:
        caveats.append(
            Caveat(
                "trace.device-unmatched",
                f"GPU work on device {', '.join(unowned)} could not be matched to a process "
                "(no host call with its correlation ids): left out",
            )
        )
    caveats.append(
        Caveat(
            "trace.several-processes",
            f"{len(stepped)} processes with profiler steps in {f.path}: each is reported as its "
            "own rank, with the GPUs whose work it launched",
        )
    )
    out = []
    for pid in sorted(stepped, key=repr):
        devs = {d: s.devices[d] for d, owner in owners.items() if owner == pid}
        label = f"{name} pid {pid}" if name else f"pid {pid}"
        out.append(_analysis(label, stepped[pid], devs, s.untimed, None, None, f.path, deadline))
    return out, caveats


def analyze(events: Sequence[Event | Mapping[str, Any]]) -> Analysis:
    """One process's step figures from a list of events (a file that holds one rank)."""
    units, _ = analyze_file(TraceFile("trace", as_events(events)))
    return units[0]


def _names(files: Sequence[TraceFile]) -> list[str | None]:
    """A name per file where there are several: its rank where each file says a
    different one, else the file's name."""
    if len(files) == 1:
        return [None]
    ranks = [f.rank for f in files]
    if None not in ranks and len(set(ranks)) == len(ranks):
        return [f"rank {r}" for r in ranks]
    return [os.path.basename(f.path) for f in files]


@dataclass(frozen=True)
class Job:
    """Every rank of a set of traces."""

    ranks: tuple[Analysis, ...]
    caveats: tuple[Caveat, ...]
    # How the files were read (stage.read): the run's files, its world size, every run
    # in them, the files skipped; empty for a job analysed from events directly.
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def common_steps(self) -> tuple[str, ...]:
        """Measured steps every rank has, in order (a step number is the same step on
        every rank of a synchronous job)."""
        sets = [{s.name for s in a.measured} for a in self.ranks]
        common = set.intersection(*sets) if sets else set()
        return tuple(s.name for s in self.ranks[0].measured if s.name in common)

    @property
    def headline(self) -> Analysis:
        """The rank whose figures lead: the one that waits most for data (or, without
        data wait, whose GPU idles most); the only one where there is one."""
        if len(self.ranks) == 1:
            return self.ranks[0]

        def key(a: Analysis) -> tuple[float, float]:
            return (a.data_wait_share or 0.0, a.gpu_idle_share or 0.0)

        return max(self.ranks, key=key)


def analyze_job(files: Sequence[TraceFile], deadline: Deadline | None = None) -> Job:
    ranks: list[Analysis] = []
    caveats: list[Caveat] = []
    for f, name in zip(files, _names(files), strict=True):
        try:
            found, said = analyze_file(f, name, deadline)
        except TooSlow:
            raise
        except UsageError as e:
            raise UsageError(f"--trace {f.path}: {e}") from None
        ranks += found
        caveats += said
    return Job(tuple(ranks), tuple(caveats))
