"""`profile --trace`: where the step time of a run already profiled goes.

Reads a torch.profiler / Kineto Chrome trace (plain or gzip JSON) and measures each
profiler step (`ProfilerStep#N`):

  data wait   host time inside `enumerate(DataLoader)#...__next__` (and inside
              `record_function("DATALOADER_WAIT")` where the loop marks it), as the
              union of those ranges cut to the step: nested or overlapping fetches
              count once, a fetch that straddles two steps is split between them
  GPU busy    the union of kernel, memcpy and memset intervals on every device and
              stream inside the step; the rest of the step is GPU idle, split as
              HolisticTraceAnalysis splits it: idle while the host waits for data
              (the part of an idle gap that overlaps a fetch), and other idle
              (kernel launch overhead, synchronisation, host code that does not
              keep the GPU fed)
  phases      the five `record_function` phases of starvecheck's own loop, where
              the trace has them

Timestamps are microseconds (Chrome trace format); Kineto writes GPU events on the
host's clock, so host and device intervals compare directly.

Warm-up: when the trace holds the profiler's very first step (ProfilerStep#0) and
at least two more, that first step is left out of every figure and reported on its
own as `first_step_ms`: start-up lands there (CUDA context, DataLoader workers
starting, cuDNN autotuning, the profiler's own start). A trace whose steps start
later came from a `schedule(wait=..., warmup=...)` that already spent steps on
that, so every step in it is measured.
"""

from __future__ import annotations

import bisect
import dataclasses
import gzip
import json
import math
import os
import re
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starvecheck.model import Caveat, Metric, StageResult
from starvecheck.stages.base import RunContext
from starvecheck.stages.profile import PHASES
from starvecheck.status import UsageError
from starvecheck.timing import too_few_runs

Interval = tuple[float, float]

WARMUP_MIN_STEPS = 3  # a warm-up step is left out only when two or more others remain
SPREAD_WARNING = 0.10  # step-time stdev over the median, as pyperf warns
GZIP_MAGIC = b"\x1f\x8b"
GPU_KERNEL = "kernel"
GPU_MEMCPY = "gpu_memcpy"
GPU_MEMSET = "gpu_memset"
# Kineto before PyTorch 1.9 spelt the GPU categories "Kernel", "Memcpy", "Memset".
_GPU_CATEGORIES = {
    "kernel": GPU_KERNEL,
    "gpu_memcpy": GPU_MEMCPY,
    "memcpy": GPU_MEMCPY,
    "gpu_memset": GPU_MEMSET,
    "memset": GPU_MEMSET,
}
_STEP = re.compile(r"ProfilerStep#(\d+)")
_FETCH_PREFIX = "enumerate(DataLoader)#"
_NUMBER = (int, float)
# A JSON escape (kept), or a backslash that starts none (doubled).
_BAD_ESCAPE = re.compile(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})?')
NO_GPU = "no GPU kernels in the trace: a CPU-only run"


def load_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The trace's events; every way a file can fail to be a trace is one usage line
    naming it (a user hands us any file, often a truncated or half-written one)."""
    name = os.fspath(path)

    def fail(why: str) -> UsageError:
        return UsageError(f"--trace {name}: {why}")

    try:
        with open(name, "rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC
            raw.seek(0)
            if gzipped:
                with gzip.GzipFile(fileobj=raw) as unzipped:
                    data = _parse(unzipped.read())
            else:
                data = _parse(raw.read())
    except FileNotFoundError:
        raise fail("no such file") from None
    except IsADirectoryError:
        raise fail("is a directory, not a trace file (name the .pt.trace.json in it)") from None
    except PermissionError:
        raise fail("permission denied") from None
    except (gzip.BadGzipFile, EOFError, zlib.error):
        raise fail("not a readable gzip file (truncated or corrupt)") from None
    except json.JSONDecodeError as e:
        raise fail(f"not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError:
        raise fail("not JSON (not UTF-8 text)") from None
    except RecursionError:
        raise fail("not a Chrome trace (JSON nested too deeply to read)") from None
    except MemoryError:
        raise fail("too large to read into memory") from None
    except ValueError as e:  # what else json rejects, such as lone surrogates
        raise fail(f"not JSON ({' '.join(str(e).split())})") from None
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    if isinstance(data, dict):
        if "traceEvents" not in data:
            raise fail("not a Chrome trace (no traceEvents)")
        data = data["traceEvents"]
        if not isinstance(data, list):
            raise fail("not a Chrome trace (traceEvents is not a list)")
    elif not isinstance(data, list):
        raise fail(f"not a Chrome trace (a JSON {type(data).__name__}, not an object)")
    events = [e for e in data if isinstance(e, dict)]
    if not any(_span(e) for e in events):
        raise fail("no timed events (complete events with ts and dur) in the trace")
    return events


def _parse(data: bytes) -> Any:
    """JSON, or the JSON that Kineto meant. Some traces are not quite JSON: Windows
    paths with unescaped backslashes in with_stack frames (pytorch/pytorch#98432),
    control characters and bytes that are not UTF-8 in names (pytorch/kineto#80, #336).
    Those only spoil names, never times, so a second try mends them as the TensorBoard
    plugin does; when that fails too, the first error is the one reported."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as first:
        text = data.decode("utf-8", errors="replace")
        try:
            return json.loads(_BAD_ESCAPE.sub(_mend_escape, text), strict=False)
        except ValueError:
            raise first from None


def _mend_escape(match: re.Match[str]) -> str:
    return match.group(0) if match.group(1) else "\\\\"


def _span(event: Mapping[str, Any]) -> Interval | None:
    """(start, end) in microseconds of a complete event; None for anything else
    (instants, metadata, counters, and events whose times are missing or absurd).
    Called for every event of traces that hold millions: kept lean."""
    if event.get("ph") != "X":
        return None
    ts, dur = event.get("ts"), event.get("dur")
    # type(), not isinstance(): JSON true is no timestamp.
    if type(ts) not in _NUMBER or type(dur) not in _NUMBER:
        return None
    try:
        start, length = float(ts), float(dur)
    except OverflowError:  # an integer past any float
        return None
    end = start + length
    return (start, end) if length >= 0 and math.isfinite(end) else None


# Interval arithmetic on sorted, disjoint lists (the output of `union`).


def union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def clip(merged: Sequence[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of `merged` inside [lo, hi); a bisection, so per-step cuts of a long
    trace stay O(log n) each."""
    ends = _Ends(merged)
    i = bisect.bisect_right(ends, lo)
    out = []
    while i < len(merged) and merged[i][0] < hi:
        a, b = max(merged[i][0], lo), min(merged[i][1], hi)
        if b > a:
            out.append((a, b))
        i += 1
    return out


class _Ends(Sequence[float]):
    """The end times of a merged list, as a sequence bisect can search without a copy."""

    def __init__(self, merged: Sequence[Interval]) -> None:
        self.merged = merged

    def __len__(self) -> int:
        return len(self.merged)

    def __getitem__(self, i: Any) -> Any:
        return self.merged[i][1]


def length(merged: Iterable[Interval]) -> float:
    return sum(b - a for a, b in merged)


def overlap(x: Sequence[Interval], y: Sequence[Interval]) -> float:
    """Total time in both of two merged lists."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            total += b - a
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class Step:
    """One profiler step's figures, in microseconds."""

    name: str
    start: float
    dur: float
    data_wait: float
    phases: Mapping[str, float] = field(default_factory=dict)  # phase -> time in the step
    gpu_busy: float | None = None  # None: no GPU in the trace
    gpu_idle_host_wait: float | None = None  # idle time that overlaps a data fetch
    memcpy: float | None = None
    memcpy_pageable: float | None = None


@dataclass(frozen=True)
class Analysis:
    steps: tuple[Step, ...]  # every step in the trace, in order
    warmup: int  # leading steps left out of the figures (0 or 1)
    whole_trace: bool  # no ProfilerStep events: the trace's span is the one step
    data_wait_source: str | None  # None: no DataLoader fetch in the trace
    dataloader: str | None  # the iterator class, e.g. "_MultiProcessingDataLoaderIter"
    phases: tuple[str, ...]  # starvecheck's phases present, in loop order
    gpu_reason: str | None  # why the GPU figures are None
    devices: int
    caveats: tuple[Caveat, ...] = ()

    @property
    def measured(self) -> tuple[Step, ...]:
        return self.steps[self.warmup :]

    @property
    def step_time(self) -> float:
        return sum(s.dur for s in self.measured)

    def share(self, attr: str) -> float | None:
        """Summed over the measured steps, over their summed time: long steps weigh
        more, as they do in the time a run takes."""
        values = [getattr(s, attr) for s in self.measured]
        if any(v is None for v in values):
            return None
        return sum(values) / self.step_time

    @property
    def data_wait_share(self) -> float | None:
        return self.share("data_wait") if self.data_wait_source else None

    @property
    def gpu_idle_share(self) -> float | None:
        busy = self.share("gpu_busy")
        return None if busy is None else max(0.0, 1.0 - busy)

    @property
    def gpu_idle_host_wait_share(self) -> float | None:
        return self.share("gpu_idle_host_wait") if self.data_wait_source else None

    @property
    def gpu_idle_other_share(self) -> float | None:
        idle, host = self.gpu_idle_share, self.gpu_idle_host_wait_share
        return None if idle is None or host is None else max(0.0, idle - host)


def _category(event: Mapping[str, Any]) -> str:
    cat = event.get("cat")
    return cat.lower() if isinstance(cat, str) else ""


def _host(category: str) -> bool:
    """A host-side category: Kineto also copies record_function ranges, ProfilerStep
    among them, onto the GPU timeline as gpu_user_annotation; those are not steps."""
    return not category.startswith("gpu_") and category not in _GPU_CATEGORIES


def _steps(
    timed: Iterable[tuple[Mapping[str, Any], Interval]],
) -> tuple[list[tuple[str, Interval]], list[Caveat]]:
    """ProfilerStep ranges of one process, in time order, and caveats about the choice."""
    found: list[tuple[Any, str, Interval]] = []
    for e, span in timed:
        name = e.get("name")
        # A zero-length step has no time to share out: left out.
        if (
            isinstance(name, str)
            and name.startswith("ProfilerStep#")
            and _STEP.fullmatch(name)
            and span[1] > span[0]
            and _host(_category(e))
        ):
            found.append((e.get("pid"), name, span))
    caveats = []
    pids = Counter(repr(pid) for pid, _, _ in found)
    if len(pids) > 1:
        # A merged trace of several ranks: their steps run side by side and would
        # count twice. Keep the process with the most.
        keep = pids.most_common(1)[0][0]
        found = [f for f in found if repr(f[0]) == keep]
        caveats.append(
            Caveat(
                "trace.several-processes",
                f"profiler steps from {len(pids)} processes in one trace: only process {keep} "
                f"({pids[keep]} steps) is measured",
            )
        )
    steps = sorted(((name, span) for _, name, span in found), key=lambda s: s[1])
    return steps, caveats


def _is_fetch(name: str) -> bool:
    return name.startswith(_FETCH_PREFIX) and "__next__" in name


@dataclass(frozen=True)
class Timeline:
    """The trace's intervals of each kind, merged (sorted and disjoint)."""

    wait: list[Interval]  # DataLoader fetches and DATALOADER_WAIT ranges
    source: str | None  # which of the two the trace holds; None: neither
    phases: dict[str, list[Interval]]  # the loop's phases present, in loop order
    busy: list[Interval]  # kernels, copies and memsets on any device
    copies: list[Interval]
    pageable: list[Interval]  # copies from unpinned host memory
    iterators: Counter[str]  # DataLoader iterator class -> fetches
    devices: int


def timeline(timed: Iterable[tuple[Mapping[str, Any], Interval]]) -> Timeline:
    fetches: list[Interval] = []
    gpu: list[Interval] = []
    copies: list[Interval] = []
    pageable: list[Interval] = []
    phases: dict[str, list[Interval]] = {p: [] for p in PHASES}
    iterators: Counter[str] = Counter()
    devices: set[str] = set()
    for e, span in timed:
        name = e.get("name")
        name = name if isinstance(name, str) else ""
        category = _category(e)
        kind = _GPU_CATEGORIES.get(category)
        if kind is not None:
            gpu.append(span)
            devices.add(repr(e.get("pid")))
            if kind == GPU_MEMCPY:
                copies.append(span)
                # Kineto names a copy from unpinned memory "Memcpy HtoD (Pageable -> Device)".
                if "pageable" in name.lower():
                    pageable.append(span)
        elif category.startswith("gpu_"):  # gpu_user_annotation: the host's ranges, copied
            continue
        elif _is_fetch(name):
            fetches.append(span)
            iterators[name[len(_FETCH_PREFIX) :].split(".", 1)[0]] += 1
        elif name in phases:
            phases[name].append(span)
    waits = phases["DATALOADER_WAIT"]
    # The loop's own DATALOADER_WAIT wraps next(iterator): PyTorch's fetch and the
    # Python around it. Where both exist, the union takes the wider.
    names = [
        n for n, found in (("DATALOADER_WAIT", waits), ("DataLoader.__next__", fetches)) if found
    ]
    return Timeline(
        wait=union(fetches + waits),
        source=" and ".join(names) or None,
        phases={p: union(r) for p, r in phases.items() if r},
        busy=union(gpu),
        copies=union(copies),
        pageable=union(pageable),
        iterators=iterators,
        devices=len(devices),
    )


def measure(name: str, lo: float, hi: float, t: Timeline) -> Step:
    """One step's figures: every kind of interval cut to [lo, hi)."""
    wait = clip(t.wait, lo, hi)
    gpu = bool(t.busy)
    busy = clip(t.busy, lo, hi)
    return Step(
        name=name,
        start=lo,
        dur=hi - lo,
        data_wait=length(wait),
        phases={p: length(clip(r, lo, hi)) for p, r in t.phases.items()},
        gpu_busy=length(busy) if gpu else None,
        # Idle while waiting: the wait, less the part of it the GPU was busy anyway.
        gpu_idle_host_wait=max(0.0, length(wait) - overlap(wait, busy)) if gpu else None,
        memcpy=length(clip(t.copies, lo, hi)) if gpu else None,
        memcpy_pageable=length(clip(t.pageable, lo, hi)) if gpu else None,
    )


def warmup_steps(steps: Sequence[Step]) -> int:
    """1 when the first step is the profiler's very first (ProfilerStep#0) and at least
    two others follow: start-up lands there (CUDA context, workers starting, cuDNN
    autotuning, the profiler's own start). A trace that starts at a later step came
    from a schedule with wait or warmup steps, which were that warm-up already."""
    return int(len(steps) >= WARMUP_MIN_STEPS and steps[0].name == "ProfilerStep#0")


def _caveats(steps: Sequence[Step], warmup: int, whole: bool, t: Timeline) -> list[Caveat]:
    out = []
    if warmup:
        out.append(
            Caveat(
                "trace.warmup-left-out",
                f"the first step ({steps[0].name}, {steps[0].dur / 1e3:,.1f} ms) is left out "
                f"as a warm-up; figures are over the other {len(steps) - 1}",
            )
        )
    elif not whole and len(steps) < WARMUP_MIN_STEPS:
        out.append(
            too_few_runs(
                f"only {len(steps)} step{'s' if len(steps) > 1 else ''} in the trace: "
                + ("no spread; " if len(steps) == 1 else "")
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
    if t.devices > 1:
        out.append(
            Caveat(
                "trace.several-devices",
                f"GPU work on {t.devices} devices: a GPU counts as busy when any of them is",
            )
        )
    return out


def analyze(events: Sequence[Mapping[str, Any]]) -> Analysis:
    """Step figures from the events of one trace (see the module docstring)."""
    timed = [(e, s) for e in events if (s := _span(e)) is not None]
    if not timed:
        raise UsageError("the trace has no timed events (complete events with ts and dur)")
    step_spans, caveats = _steps(timed)
    whole = not step_spans
    if whole:
        lo = min(s[0] for _, s in timed)
        hi = max(s[1] for _, s in timed)
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
    t = timeline(timed)
    steps = [measure(name, lo, hi, t) for name, (lo, hi) in step_spans]
    warmup = warmup_steps(steps)
    return Analysis(
        steps=tuple(steps),
        warmup=warmup,
        whole_trace=whole,
        data_wait_source=t.source,
        dataloader=t.iterators.most_common(1)[0][0] if t.iterators else None,
        phases=tuple(t.phases),
        gpu_reason=None if t.busy else NO_GPU,
        devices=t.devices,
        caveats=tuple(caveats + _caveats(steps, warmup, whole, t)),
    )


def _figure(name: str, value: float | None, unit: str, reason: str = "not measured") -> Metric:
    """One figure of a kind (steps, first_step_ms, gpu_idle_share, ...): its quantity
    is its name, the one label it carries; missing, with the reason, where None."""
    labels = {"quantity": name}
    if value is None:
        return Metric.missing(name, unit, reason, labels)
    return Metric.single(name, value, unit, labels)


def _per_step(name: str, values: Sequence[float]) -> Metric:
    """A figure timed in each measured step, in ms."""
    return Metric.repeated(name, values, "ms", {"quantity": name})


def metrics(a: Analysis) -> list[Metric]:
    measured = a.measured
    out = [
        _figure("steps", len(a.steps), "steps"),
        _per_step("step_ms", [s.dur / 1e3 for s in measured]),
    ]
    if a.warmup:
        out.append(_figure("first_step_ms", a.steps[0].dur / 1e3, "ms"))
    no_wait = "no DataLoader fetch in the trace"
    if a.data_wait_share is not None:
        out.append(_figure("data_wait_share", a.data_wait_share, "fraction"))
        out.append(_per_step("data_wait_ms", [s.data_wait / 1e3 for s in measured]))
    else:
        out.append(_figure("data_wait_share", None, "fraction", no_wait))
        out.append(_figure("data_wait_ms", None, "ms", no_wait))
    gpu: list[tuple[str, float | None, str | None]] = [
        ("gpu_idle_share", a.gpu_idle_share, a.gpu_reason),
        ("gpu_idle_host_wait_share", a.gpu_idle_host_wait_share, a.gpu_reason or no_wait),
        ("gpu_idle_other_share", a.gpu_idle_other_share, a.gpu_reason or no_wait),
        ("memcpy_share", a.share("memcpy"), a.gpu_reason),
        ("memcpy_pageable_share", a.share("memcpy_pageable"), a.gpu_reason),
    ]
    for name, value, reason in gpu:
        out.append(_figure(name, value, "fraction", reason or "not measured"))
    for phase in a.phases:
        out.append(
            Metric.repeated(
                f"phase_ms.{phase.lower()}",
                [s.phases[phase] / 1e3 for s in measured],
                "ms",
                {"quantity": "phase_ms", "phase": phase.lower()},
            )
        )
    return out


def _spread_caveat(step_ms: Metric) -> Caveat | None:
    if step_ms.n < 2 or not step_ms.median or step_ms.stdev is None:
        return None
    spread = step_ms.stdev / step_ms.median
    if spread < SPREAD_WARNING:
        return None
    return Caveat(
        "trace.steps-vary",
        f"step time varies: stdev {step_ms.stdev:,.1f} ms is {spread:.0%} of the median "
        f"{step_ms.median:,.1f} ms (range {step_ms.min:,.1f} … {step_ms.max:,.1f} ms): "
        "shares are averages over unlike steps; profile more steps, or look for the slow ones",
    )


def result(analysis: Analysis, path: str | os.PathLike[str]) -> StageResult:
    found = metrics(analysis)
    caveats = list(analysis.caveats)
    spread = _spread_caveat(next(m for m in found if m.matches(quantity="step_ms")))
    if spread:
        caveats.append(spread)
    params: dict[str, Any] = {
        "trace": os.fspath(path),
        "steps": len(analysis.steps),
        "measured_steps": len(analysis.measured),
        "warmup_steps": analysis.warmup,
        "whole_trace": analysis.whole_trace,
        "data_wait_source": analysis.data_wait_source,
        "dataloader": analysis.dataloader,
        "phases": [p.lower() for p in analysis.phases],
        "gpu_devices": analysis.devices,
    }
    return StageResult(
        stage="profile",
        parameters=params,
        metrics=tuple(found),
        caveats=tuple(caveats),
    )


class TraceStage:
    """`profile --trace FILE` in the registry (stages/base.Stage): a torch.profiler
    trace of another run, analysed. Its result reports under the stage `profile`
    (schema 1 named it so), its figures labelled with their quantity alone where the
    loop's carry a layout and num_workers."""

    name = "trace"

    def unavailable(self) -> str | None:
        return None

    def plan(self, options: Mapping[str, Any], ctx: RunContext) -> str:
        return str(options["trace"])

    def doctor_plan(self, workload: Any, quick: bool, ctx: RunContext) -> str:
        raise NotImplementedError("doctor does not read traces")

    def measure(self, plan: str, ctx: RunContext) -> StageResult:
        """load_events -> analyze -> result, with the file named in any usage error."""
        start = time.perf_counter()
        events = load_events(plan)
        try:
            analysis = analyze(events)
        except UsageError as e:
            raise UsageError(f"--trace {plan}: {e}") from None
        out = result(analysis, plan)
        return dataclasses.replace(out, duration_s=round(time.perf_counter() - start, 3))


STAGE = TraceStage()
