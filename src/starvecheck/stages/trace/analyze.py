"""Step figures of every rank in a set of traces (see the package docstring).

One pass over each file's events sorts them into processes (a rank's host events,
by pid) and devices (its GPU events, by device), keeping only what the figures need:
profiler steps, DataLoader fetches, the loop's phases, and the GPU's kernels, copies
and memsets. A file that merges several ranks is split by the processes that hold
profiler steps; each GPU device goes to the process that launched its work (the
correlation ids of the host's runtime calls), so no figure mixes two ranks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starvecheck.model import Caveat
from starvecheck.stages.profile import PHASES
from starvecheck.stages.trace import hta
from starvecheck.stages.trace.intervals import Interval, clip, length, overlap, union
from starvecheck.stages.trace.load import Event, TraceFile, as_events, span
from starvecheck.status import UsageError
from starvecheck.timing import too_few_runs

WARMUP_MIN_STEPS = 3  # a warm-up step is left out only when two or more others remain
STUB_SHARE = 0.10  # a last step under this share of the others' median is the profiler closing
AFTER_LAST_STEP = 0.01  # GPU busy time after the last step worth a caveat
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
COPY_KINDS = ("h2d", "d2h", "d2d")
_COPY_KIND = {"htod": "h2d", "dtoh": "d2h", "dtod": "d2d", "ptop": "d2d"}


def _category(cat: Any) -> str:
    return cat.lower() if isinstance(cat, str) else ""


def _host(category: str) -> bool:
    """A host-side category: Kineto also copies record_function ranges, ProfilerStep
    among them, onto the GPU timeline as gpu_user_annotation; those are not steps."""
    return not category.startswith("gpu_") and category not in GPU_CATEGORIES


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
class _Device:
    """One device's GPU events, sorted out."""

    busy: list[Interval] = field(default_factory=list)
    copies: dict[str, list[Interval]] = field(default_factory=lambda: defaultdict(list))
    pageable: list[Interval] = field(default_factory=list)
    collectives: list[Interval] = field(default_factory=list)
    # Per stream, every GPU event (start, end, correlation id): HTA's idle split.
    streams: dict[Any, list[hta.Launch]] = field(default_factory=lambda: defaultdict(list))
    launches: list[Any] = field(default_factory=list)  # correlation ids, to find its process


@dataclass
class _Process:
    """One process's host events that the figures read."""

    steps: list[tuple[str, Interval]] = field(default_factory=list)
    fetches: list[Interval] = field(default_factory=list)
    phases: dict[str, list[Interval]] = field(default_factory=lambda: defaultdict(list))
    iterators: Counter[str] = field(default_factory=Counter)
    launched: dict[Any, float] = field(default_factory=dict)  # correlation id -> host call start
    collectives: list[Interval] = field(default_factory=list)  # on the host (gloo, MPI, UCC)

    def absorb(self, other: _Process) -> None:
        """Take another process's fetches, phases and host collectives (its steps and
        launches stay)."""
        self.fetches += other.fetches
        self.collectives += other.collectives
        self.iterators.update(other.iterators)
        for ph, r in other.phases.items():
            self.phases[ph] += r


@dataclass
class _Sorted:
    processes: dict[Any, _Process]
    devices: dict[Any, _Device]
    untimed: str | None  # why device activity is not timed, where the trace has such
    lo: float
    hi: float


def sort_events(events: Iterable[Event]) -> _Sorted:
    """One pass over a file's events: hot, so kept lean."""
    processes: dict[Any, _Process] = defaultdict(_Process)
    devices: dict[Any, _Device] = defaultdict(_Device)
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
    return _Sorted(dict(processes), dict(devices), untimed, lo, hi)


def _key(pid: Any) -> Any:
    """A pid or device id usable as a key (JSON may hold any type there)."""
    return pid if isinstance(pid, int | float | str) and not isinstance(pid, bool) else repr(pid)


def _owners(processes: Mapping[Any, _Process], devices: Mapping[Any, _Device]) -> dict[Any, Any]:
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
    """One rank's intervals of each kind, merged (sorted and disjoint)."""

    wait: list[Interval]  # DataLoader fetches and DATALOADER_WAIT ranges
    source: str | None  # which of the two the trace holds; None: neither
    phases: dict[str, list[Interval]]  # the loop's phases present, in loop order
    devices: dict[Any, _Merged]
    iterators: Counter[str]
    host_collectives: list[Interval]


@dataclass(frozen=True)
class _Merged:
    busy: list[Interval]
    copies: dict[str, list[Interval]]
    collectives: list[Interval]
    memcpy: list[Interval]


def timeline(p: _Process, devices: Mapping[Any, _Device]) -> Timeline:
    waits = p.phases.get("DATALOADER_WAIT", [])
    # The loop's own DATALOADER_WAIT wraps next(iterator): PyTorch's fetch and the
    # Python around it. Where both exist, the union takes the wider.
    names = [
        n for n, found in (("DATALOADER_WAIT", waits), ("DataLoader.__next__", p.fetches)) if found
    ]
    merged = {}
    for dev, d in sorted(devices.items(), key=lambda kv: repr(kv[0])):
        copies = {k: union(v) for k, v in d.copies.items()}
        copies["h2d_pageable"] = union(d.pageable)
        every = [iv for k, v in d.copies.items() for iv in v]
        merged[dev] = _Merged(union(d.busy), copies, union(d.collectives), union(every))
    return Timeline(
        wait=union(p.fetches + waits),
        source=" and ".join(names) or None,
        phases={ph: union(p.phases[ph]) for ph in PHASES if p.phases.get(ph)},
        devices=merged,
        iterators=p.iterators,
        host_collectives=union(p.collectives),
    )


def measure(name: str, lo: float, hi: float, t: Timeline) -> Step:
    """One step's figures: every kind of interval cut to [lo, hi)."""
    wait = clip(t.wait, lo, hi)
    waited = length(wait)
    devices = {}
    for dev, d in t.devices.items():
        busy = clip(d.busy, lo, hi)
        devices[dev] = DeviceStep(
            busy=length(busy),
            # Idle while waiting: the wait, less the part of it the GPU was busy anyway.
            idle_data_wait=max(0.0, waited - overlap(wait, busy)),
            copies={k: length(clip(v, lo, hi)) for k, v in d.copies.items()},
            collectives=length(clip(d.collectives, lo, hi)),
            memcpy=length(clip(d.memcpy, lo, hi)),
        )
    return Step(
        name=name,
        start=lo,
        dur=hi - lo,
        data_wait=waited,
        phases={p: length(clip(r, lo, hi)) for p, r in t.phases.items()},
        devices=devices,
        host_collectives=length(clip(t.host_collectives, lo, hi)),
    )


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


def _caveats(a: Analysis, t: Timeline, all_busy: Mapping[Any, list[Interval]]) -> list[Caveat]:
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
        outside = length(t.wait) - sum(
            length(clip(t.wait, s.start, s.start + s.dur)) for s in steps
        )
        if outside > 0.0005 * length(t.wait):  # more than float rounding
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
    if not a.whole_trace and steps:
        end = steps[-1].start + steps[-1].dur
        for dev, busy in all_busy.items():
            total = length(busy)
            after = length(clip(busy, end, math.inf))
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
    p: _Process,
    devices: Mapping[Any, _Device],
    untimed: str | None,
    whole: tuple[float, float] | None,
    rank: int | None,
    path: str,
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
    steps = [measure(n, lo, hi, t) for n, (lo, hi) in step_spans]
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


def analyze_file(f: TraceFile, name: str | None = None) -> tuple[list[Analysis], list[Caveat]]:
    """Every rank in one file: one Analysis per process that holds profiler steps
    (one for the whole trace where none does)."""
    s = sort_events(f.events)
    if s.lo == math.inf:
        raise UsageError("the trace has no timed events (complete events with ts and dur)")
    stepped = {pid: p for pid, p in s.processes.items() if p.steps}
    caveats: list[Caveat] = []
    base = name or (f"rank {f.rank}" if f.rank is not None else "process")
    if not stepped:
        merged = _Process()
        for p in s.processes.values():
            merged.absorb(p)
        return [
            _analysis(base, merged, s.devices, s.untimed, (s.lo, s.hi), f.rank, f.path)
        ], caveats
    if len(stepped) == 1:
        ((pid, p),) = stepped.items()
        # Fetches and phases in other processes (threads logged under another pid)
        # belong to the one that steps.
        for other, q in s.processes.items():
            if other != pid:
                p.absorb(q)
        return [_analysis(base, p, s.devices, s.untimed, None, f.rank, f.path)], caveats
    owners = _owners(stepped, s.devices)
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
        out.append(_analysis(label, stepped[pid], devs, s.untimed, None, None, f.path))
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


def analyze_job(files: Sequence[TraceFile]) -> Job:
    ranks: list[Analysis] = []
    caveats: list[Caveat] = []
    for f, name in zip(files, _names(files), strict=True):
        try:
            found, said = analyze_file(f, name)
        except UsageError as e:
            raise UsageError(f"--trace {f.path}: {e}") from None
        ranks += found
        caveats += said
    return Job(tuple(ranks), tuple(caveats))
