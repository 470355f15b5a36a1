"""One loop's figures, step by step: what the timer measured, the metrics made of them,
and their encoding for the exchange between ranks.

A *step* is one batch: its data wait (the call to `next()` on the loader, or a
trainer's gap between two steps) and its compute (from the batch to the next `next()`,
or to the step's end). A *pass* is one iteration over the loader (a `for` over the
watch, a trainer's epoch). The timer (loop/timer.py) appends one entry per completed
step to each array; everything here only reads them, so tests build a `LoopTimes` by
hand, and rank 0 rebuilds one from each rank's bytes (`RankTimes.decode`).

The encoding is JSON: a header, and each per-step array as base64 of its float64 bytes.
"""

from __future__ import annotations

import base64
import json
import socket
import sys
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import LoadFigures
from starvecheck.core.schema.steps import Step, StepFigure, StepFigures
from starvecheck.loop import sent
from starvecheck.loop.cpu import machine_facts
from starvecheck.loop.gpuclock import figures as gpu_figures
from starvecheck.loop.handover import Handover
from starvecheck.loop.sent import MACHINE_SENT
from starvecheck.loop.splits import StageSplit, restart_wait_ms

SOURCE = "starvecheck.watch"
VERSION = 1  # of the encoding
# The per-step arrays, in seconds, one entry per completed step.
ARRAYS = (
    "waits",
    "computes",
    "wait_cpu",
    "compute_cpu",
    "wait_runq",
    "compute_runq",
    "rank_waits",
    "compute_process_cpu",
    "wait_process_cpu",
)


def _seconds() -> array[float]:
    return array("d")


@dataclass
class LoopTimes:
    """A loop's per-step seconds and how it was timed; the metrics are made from them
    on demand (`metrics()`), the first step left out as a warm-up."""

    waits: array[float] = field(default_factory=_seconds)  # the data wait of each step
    computes: array[float] = field(default_factory=_seconds)  # the rest of the step
    # CPU seconds of the loop's own thread in each: at num_workers=0 the wait is the
    # process making the batch, and its CPU share says CPU work from I/O or sleep.
    wait_cpu: array[float] = field(default_factory=_seconds)
    compute_cpu: array[float] = field(default_factory=_seconds)
    # CPU seconds of the whole training process (all its threads: torch's intra-op
    # pool, a pin-memory thread) in each compute: the CPUs the step itself keeps busy,
    # which DataLoader workers would compete with.
    compute_process_cpu: array[float] = field(default_factory=_seconds)
    # ... and in each wait: at num_workers=0, the CPU making the batch takes on all the
    # process's threads (torch's intra-op pool runs ToTensor, Normalize, an STFT there),
    # which one thread's time alone misses.
    wait_process_cpu: array[float] = field(default_factory=_seconds)
    # Seconds the loop's thread waited for a CPU (Linux schedstat) while it waited for
    # its batch: on a busy machine, CPU work it could not get, not I/O.
    wait_runq: array[float] = field(default_factory=_seconds)
    # ... and in each compute (a trainer's read on its hooks' thread; 0 where a hook ran
    # on another): workers competing for the CPUs, which num_workers=0 would not have
    compute_runq: array[float] = field(default_factory=_seconds)
    # Seconds at the barrier after each batch arrived (barrier=True under
    # torch.distributed): the time this rank waited for the others' batches.
    rank_waits: array[float] = field(default_factory=_seconds)
    offset: int = 0  # the step the arrays start at: above 0 for a rank's last steps
    passes: int = 0
    iterator: str | None = None  # the class of iter(loader), e.g. a DataLoader's
    num_workers: int | None = None  # a DataLoader's, when it says
    sync: bool = False  # torch.cuda.synchronize() before each wait
    # (steps completed, the worker processes' summed CPU seconds), sampled every few
    # steps: their CPU per batch says CPU work from I/O or sleep.
    worker_cpu: list[tuple[int, float]] = field(default_factory=list)
    # (steps, CPU seconds) of the workers in passes already ended: a pass's workers may
    # be new processes, so each pass is counted from its own samples.
    worker_cpu_before: tuple[int, float] = (0, 0.0)
    # The same for the workers' seconds runnable but waiting for a CPU (schedstat): a
    # worker's time per batch less this is what it takes with a CPU of its own.
    worker_runq: list[tuple[int, float]] = field(default_factory=list)
    worker_runq_before: tuple[int, float] = (0, 0.0)
    notes: list[Caveat] = field(default_factory=list)  # what the timer found to say
    # The largest of the first batches, in bytes of arrays (loading/stamps.batch_nbytes):
    # what a worker would hand over (a trainer's hooks that see no batch: the workers'
    # own count of theirs). None: not read.
    batch_bytes: int | None = None
    # What handing such a batch from a worker costs here, and a worker's start
    # (loop/handover.measure); None: not measured.
    handover: Handover | None = None
    # The first batches' samples, digested (loop/samples.py), by pass: the last two.
    digests: dict[int, list[int]] = field(default_factory=dict)
    digest_gaps: int = 0  # first batches no digest could be made of
    batch_samples: int | None = None  # the first batch's leading size (fingerprints.leading)
    sampler: str | None = None  # the DataLoader's sampler class
    sampler_shuffle: bool | None = None  # it says it shuffles
    sampler_epochs: list[int] = field(default_factory=list)  # its epoch as each pass began
    # The GPU's clock (loop/gpuclock.py): each resolved step's idle time waiting for
    # data and its period on the device, ms; steps whose events were not read.
    gpu_idle: array[float] = field(default_factory=_seconds)
    gpu_period: array[float] = field(default_factory=_seconds)
    gpu_unresolved: int = 0
    headspace: list[float] = field(default_factory=list)  # replayed steps, s (headspace.py)
    # About once a second (loop/cpu.MachineCpu): the CPUs other processes kept busy
    # beside this process and its workers, and this process's own (all its threads).
    others_cpus: list[float] = field(default_factory=list)
    process_cpus: list[float] = field(default_factory=list)
    # Each step's wait split over the stages of loading (loop/splits.py, loading/).
    split: StageSplit = field(default_factory=StageSplit)

    def same_order(self) -> bool | None:
        """The last two passes began with the same samples in the same order; None
        where two passes were not both digested."""
        passes = sorted(p for p, d in self.digests.items() if d)
        if len(passes) < 2:
            return None
        a, b = self.digests[passes[-2]], self.digests[passes[-1]]
        n = min(len(a), len(b))
        return n > 0 and a[:n] == b[:n]

    def __post_init__(self) -> None:
        for name in ARRAYS:  # lists are welcome (tests); the timer appends to arrays
            values = getattr(self, name)
            if not isinstance(values, array):
                setattr(self, name, array("d", values))

    @property
    def steps(self) -> int:
        """Steps completed, those before `offset` (not sent) included."""
        return self.offset + len(self.computes)

    def stopped_inside(
        self, seconds: float, cpu_s: float, process_cpu_s: float, runq_s: float = 0.0
    ) -> None:
        """The loop stopped early (break, an exception): its last step ends now."""
        self.computes.append(seconds)
        self.compute_cpu.append(cpu_s)
        self.compute_process_cpu.append(process_cpu_s)
        self.compute_runq.append(runq_s)

    def drop_unfinished(self) -> None:
        """Forget a batch whose step never finished (the loop stopped inside it)."""
        n = len(self.computes)
        for a in (
            self.waits,
            self.wait_cpu,
            self.wait_runq,
            self.rank_waits,
            self.wait_process_cpu,
        ):
            del a[n:]
        self.split.cut(n)

    # The metrics

    def metrics(self) -> list[Metric]:
        """The loop's figures, one of a kind each and labelled with their quantity alone,
        as a trace's are (`profile --trace`): judged and shown as one step breakdown;
        the wait by stage among them, before the first step's."""
        head, split, tail = self.figures()
        return [*head.to_metrics(), *split.to_metrics(), *tail.to_metrics()]

    def figures(self) -> tuple[StepFigures, LoadFigures, StepFigures]:
        """The loop's figures as their records: the breakdown, the wait by stage, and
        the first step (left out of the breakdown's figures), in the order written."""
        barrier = self.rank_waits if len(self.rank_waits) == len(self.waits) else None
        steps = [w + c for w, c in zip(self.waits, self.computes, strict=False)]
        if barrier is not None:
            steps = [s + b for s, b in zip(steps, barrier, strict=False)]
        out = [_single(Step.STEPS, self.offset + len(steps), "steps")]
        if not steps:
            out += [
                _missing(Step.STEP_MS, "ms", "no step completed"),
                _missing(Step.DATA_WAIT_SHARE, "fraction", "no step completed"),
            ]
            return StepFigures(tuple(out)), LoadFigures(), StepFigures()
        # The first step is a warm-up, left out (where it is here and others are).
        first, rest = (1, steps[1:]) if len(steps) > 1 and not self.offset else (0, steps)
        waits, computes = self.waits[first:], self.computes[first:]
        total = sum(rest)
        out += [
            _ms(Step.STEP_MS, rest),
            _ms(Step.DATA_WAIT_MS, waits),
            _ms(Step.COMPUTE_MS, computes),
            _single(Step.DATA_WAIT_SHARE, sum(waits) / total if total > 0 else 0.0, "fraction"),
        ]
        if barrier is not None and len(barrier) > first:
            out.append(_ms(Step.RANK_WAIT_MS, barrier[first:]))
        if (restart := restart_wait_ms(self.waits, first, self.split.pass_starts)) is not None:
            out.append(_single(Step.RESTART_WAIT_MS, restart, "ms"))
        out += gpu_figures(self.gpu_idle, self.gpu_period, self.gpu_unresolved)
        if self.headspace:
            out.append(_ms(Step.HEADSPACE_STEP_MS, self.headspace))
        out += self._cpu_figures(first)
        tail = []
        if first:
            tail = [
                _single(Step.FIRST_STEP_MS, steps[0] * 1e3, "ms"),
                _single(Step.FIRST_WAIT_MS, self.waits[0] * 1e3, "ms"),
            ]
        split = self.split.figures(self.waits, first, self.computes)
        return StepFigures(tuple(out)), split, StepFigures(tuple(tail))

    def _cpu_figures(self, first: int) -> list[StepFigure]:
        """The loop thread's CPU in its waits and computes, its wait for a CPU, and the
        workers' CPU per batch: what says CPU work from I/O or sleep."""
        out = []
        if len(self.wait_cpu) == len(self.waits) and len(self.compute_cpu) == len(self.computes):
            out += [
                _ms(Step.DATA_WAIT_CPU_MS, self.wait_cpu[first:]),
                _ms(Step.COMPUTE_CPU_MS, self.compute_cpu[first:]),
            ]
            if len(self.wait_runq) == len(self.waits) and any(self.wait_runq[first:]):
                out.append(_ms(Step.DATA_WAIT_RUNQUEUE_MS, self.wait_runq[first:]))
            if len(self.compute_runq) == len(self.computes) and any(self.compute_runq[first:]):
                out.append(_ms(Step.COMPUTE_RUNQUEUE_MS, self.compute_runq[first:]))
        if len(self.compute_process_cpu) == len(self.computes) > first:
            out.append(_ms(Step.COMPUTE_PROCESS_CPU_MS, self.compute_process_cpu[first:]))
        if len(self.wait_process_cpu) == len(self.waits) > first:
            out.append(_ms(Step.DATA_WAIT_PROCESS_CPU_MS, self.wait_process_cpu[first:]))
        per_batch = self.worker_cpu_per_batch()
        if per_batch is not None:
            out.append(_single(Step.WORKER_CPU_MS, per_batch, "ms"))
        runq = _per_batch(self._total(self.worker_runq, self.worker_runq_before))
        if runq is not None and per_batch is not None:
            out.append(_single(Step.WORKER_RUNQUEUE_MS, runq, "ms"))
        if self.batch_bytes is not None:
            out.append(_single(Step.BATCH_BYTES, self.batch_bytes, "bytes"))
        if (h := self.handover) is not None:
            out += [
                _single(Step.HANDOVER_WORKER_CPU_MS, h.worker_ms, "ms"),
                _single(Step.HANDOVER_MAIN_MS, h.main_ms, "ms"),
            ]
            if h.start_ms is not None:
                out.append(_single(Step.WORKER_START_MS, h.start_ms, "ms"))
        for quantity, each in (
            (Step.OTHERS_CPUS_EACH_S, self.others_cpus),
            (Step.PROCESS_CPUS_EACH_S, self.process_cpus),
        ):
            if each:
                out.append(StepFigure(quantity, Figure.repeated(each), "CPUs"))
        return out

    def new_pass(self) -> None:
        """A pass begins: the last pass's worker CPU is kept, its samples cleared."""
        self.worker_cpu_before = self._worker_cpu_total()
        self.worker_cpu = []
        self.worker_runq_before = self._total(self.worker_runq, self.worker_runq_before)
        self.worker_runq = []

    def _worker_cpu_total(self) -> tuple[int, float]:
        return self._total(self.worker_cpu, self.worker_cpu_before)

    @staticmethod
    def _total(samples: list[tuple[int, float]], before: tuple[int, float]) -> tuple[int, float]:
        """(steps, seconds) over every pass: the passes ended, and this one's samples."""
        steps, seconds = before
        if len(samples) >= 2:
            (s0, c0), (s1, c1) = samples[0], samples[-1]
            if s1 > s0 and c1 >= c0:
                steps, seconds = steps + s1 - s0, seconds + c1 - c0
        return steps, seconds

    def worker_cpu_per_batch(self) -> float | None:
        """The worker processes' CPU milliseconds per batch, between the first and last
        sample of each pass (several steps apart)."""
        steps, cpu = self._worker_cpu_total()
        return cpu / steps * 1e3 if steps > 0 else None

    def parameters(self) -> dict[str, Any]:
        """How this loop was timed (what the judgement reads beside the figures)."""
        return {
            "data_wait_source": SOURCE,
            "dataloader": self.iterator,
            "sync": self.sync,
            "passes": self.passes,
            "num_workers": self.num_workers,
            "effective_cpus": _effective_cpus(),
            **machine_facts(),
            "sampler": self.sampler,
            "sampler_shuffle": self.sampler_shuffle,
            "sampler_epochs": self.sampler_epochs[-2:],
            "same_order_passes": self.same_order(),
            "samples_digested": len(max(self.digests.values(), key=len, default=[])),
            **self.split.parameters(),
        }

    def caveats(self) -> list[Caveat]:
        caveats = list(self.notes)
        first = 1 if len(self.waits) > 1 and not self.offset else 0
        caveats += self.split.caveats(len(self.waits), first)
        if len(self.computes) > 1:
            caveats.append(
                Caveat(
                    "watch.warmup-left-out",
                    "the first step is left out of every figure as a warm-up (worker "
                    "start-up, CUDA context, the first prefetch)",
                )
            )
        if not self.sync and _cuda_in_use() and not self.gpu_period:
            caveats.append(
                Caveat(
                    "watch.unsynchronized",
                    "sync=False: on a GPU, work the step queued but did not wait for shows up "
                    "as data wait in the next next(); pass sync=True to time each step to its "
                    "end",
                )
            )
        return caveats

    # The exchange between ranks (loop/ranks.py carries the bytes)

    def encode(self, *, rank: int, final: bool, window: int) -> bytes:
        """These figures as bytes for another rank: at most the last `window` steps (what
        is sent stays bounded however long the job runs). `final`: the pass has ended."""
        n = len(self.computes)
        cut = max(0, n - window)
        head = {
            "v": VERSION,
            "rank": rank,
            "host": socket.gethostname(),
            "pass": self.passes,
            "final": final,
            "steps": self.offset + n,
            "offset": self.offset + cut,
            "params": self.parameters(),
            "notes": [[c.id, c.text] for c in self.notes],
            # All that is read of it: the steps and CPU seconds of every pass.
            "worker_cpu": [(0, 0.0), total] if (total := self._worker_cpu_total())[0] else [],
            "worker_runq": [(0, 0.0), q]
            if (q := self._total(self.worker_runq, self.worker_runq_before))[0]
            else [],
            "arrays": {
                a: base64.b64encode(getattr(self, a)[cut:].tobytes()).decode() for a in ARRAYS
            },
            "digests": {str(k): v for k, v in self.digests.items()},
            "gpu": [
                list(self.gpu_idle[-window:]),
                list(self.gpu_period[-window:]),
                self.gpu_unresolved,
            ],
            "headspace": self.headspace,
            # the machine beside this rank, its last readings (about one a second)
            "machine": [self.others_cpus[-MACHINE_SENT:], self.process_cpus[-MACHINE_SENT:]],
            "split": self.split.encode(cut),
        }
        return json.dumps(head).encode()


@dataclass(frozen=True)
class RankTimes:
    """One rank's figures as the exchange carries them: who sent them, whether its pass
    had ended (`final`), how it was timed (`params`, its own `parameters()`), and the
    figures themselves (its last steps: `times.offset` says where they start)."""

    rank: int
    host: str
    final: bool
    params: Mapping[str, Any]
    times: LoopTimes

    @property
    def steps(self) -> int:
        return self.times.steps

    @property
    def passes(self) -> int:
        return self.times.passes

    @classmethod
    def decode(cls, data: bytes) -> RankTimes:
        p = json.loads(data)
        arrays = {}
        for name in ARRAYS:
            a = array("d")
            a.frombytes(base64.b64decode(p["arrays"].get(name, "")))
            arrays[name] = a
        params = p.get("params", {})
        times = LoopTimes(
            **arrays,
            offset=p.get("offset", 0),
            passes=p["pass"],
            iterator=params.get("dataloader"),
            num_workers=params.get("num_workers"),
            sync=bool(params.get("sync")),
            worker_cpu=[(int(s), float(c)) for s, c in p.get("worker_cpu", ())],
            worker_runq=[(int(s), float(c)) for s, c in p.get("worker_runq", ())],
            notes=[Caveat(i, t) for i, t in p.get("notes", ())],
            digests=sent.digests(p.get("digests")),
            sampler=params.get("sampler"),
            sampler_shuffle=params.get("sampler_shuffle"),
            sampler_epochs=[e for e in params.get("sampler_epochs") or () if isinstance(e, int)],
            **sent.gpu(p.get("gpu"), p.get("headspace")),
            **sent.machine(p.get("machine")),
            split=StageSplit.decode(p.get("split")),
        )
        return cls(int(p["rank"]), str(p.get("host", "")), bool(p["final"]), params, times)


def _single(quantity: Step, value: float, unit: str) -> StepFigure:
    return StepFigure(quantity, Figure.single(value), unit)


def _missing(quantity: Step, unit: str, reason: str) -> StepFigure:
    return StepFigure(quantity, Figure.missing(reason), unit)


def _ms(quantity: Step, seconds: Iterable[float]) -> StepFigure:
    """A figure timed in each measured step, seconds in, ms out."""
    return StepFigure(quantity, Figure.repeated([s * 1e3 for s in seconds]), "ms")


def _cuda_in_use() -> bool:
    """Whether the loop could be queueing GPU work: torch loaded and a device there.
    Never imports torch itself."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


def _effective_cpus() -> float | None:
    """The CPUs this process may use: its affinity, capped by a cgroup CPU quota
    (fractional quotas kept as they are); None when neither can be read."""
    from starvecheck.probe.machine import process_cpus

    return process_cpus()


def _per_batch(total: tuple[int, float]) -> float | None:
    steps, seconds = total
    return seconds / steps * 1e3 if steps > 0 else None
