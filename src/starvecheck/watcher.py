"""`starvecheck.watch(loader)`: how long your own training loop waits for data.

Wrap the iterable your loop already uses; nothing else changes:

    for batch in starvecheck.watch(loader, sync=True):
        train_step(batch)

For each batch it times two things with `time.perf_counter`:

  wait     the call to `next()` on your iterable: the loop waits for data
  compute  from receiving a batch to asking for the next one: your step

so a step is wait + compute and the data-wait share is the summed waits over the
summed steps. With `sync=True` it calls `torch.cuda.synchronize()` before it starts
timing each wait, so a step's queued GPU work counts as compute instead of showing
up later as time spent in `next()`. The first step (worker start-up, CUDA
context, first-batch prefetch) is left out of every figure and reported on its own.

Under torch.distributed (a process group initialised when the loop starts) each rank
times its own loop and rank 0 reports every rank: a per-rank table, the straggler
whose data wait holds the others up, and whether it is always the same rank
(starvecheck.loopranks). `barrier=True` adds a timed `dist.barrier()` once each batch
has arrived, so what the other ranks lose waiting for a slow rank's data is measured
there (`rank_wait_ms`) rather than estimated.

Trainers call the same timing through `begin()` and `end()` (starvecheck.integrations:
a step begins with its batch in hand and ends after the optimizer step; the data wait
is the time between one step's end and the next one's begin).

At the end of each pass (and every `every` steps) it prints the step breakdown and
the checklist that `starvecheck profile --trace` gives for a trace, to stderr, or
returns it: `report()`, `result()`, `summary()`. The per-step cost is a few
perf_counter calls and two list appends (see benchmarks/watch_overhead.py).
"""

from __future__ import annotations

import os
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TextIO, TypeVar

from starvecheck.model import Caveat, Metric, Report, StageResult

if TYPE_CHECKING:
    from starvecheck.loopranks import Gathered, Peers

T = TypeVar("T")
SOURCE = "starvecheck.watch"


class Watch(Generic[T]):
    """An iterable over `iterable`'s items that times the loop consuming them."""

    def __init__(
        self,
        iterable: Iterable[T],
        *,
        sync: bool = False,
        every: int | None = None,
        file: TextIO | None = None,
        show: bool = True,
        barrier: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be a positive number of steps, not {every!r}")
        self.iterable = iterable
        self.sync = sync
        self.barrier = barrier
        self.every = every
        self.file = file
        self.show = show
        self.clock = clock
        self.waits = array("d")  # seconds, one per completed step
        self.computes = array("d")
        # CPU seconds of the loop's own thread in each: at num_workers=0 the wait is the
        # process making the batch, and its CPU share says CPU work from I/O or sleep.
        self.wait_cpu = array("d")
        self.compute_cpu = array("d")
        # Seconds the loop's thread waited for a CPU (Linux schedstat) while it waited for
        # its batch: on a busy machine, CPU work it could not get, not I/O.
        self.wait_runq = array("d")
        # Seconds at the barrier after each batch arrived (barrier=True under
        # torch.distributed): the time this rank waited for the others' batches.
        self.rank_waits = array("d")
        self.offset = 0  # the step the arrays start at: above 0 for a rank's last steps
        self.passes = 0
        self.iterator: str | None = None  # the class of iter(iterable), e.g. a DataLoader's
        self.num_workers: int | None = None  # a DataLoader's, when it says
        # (steps completed, the worker processes' summed CPU seconds), sampled every
        # WORKER_SAMPLE steps: their CPU per batch says CPU work from I/O or sleep.
        self.worker_cpu: list[tuple[int, float]] = []
        self.notes: list[Caveat] = []
        self._synchronize: Callable[[], None] | None = None
        self._barrier: Callable[[], object] | None = None
        self._printed_at = 0  # steps completed when the report was last printed
        self.peers: Peers | None = None  # the other ranks, under torch.distributed
        self._found_peers = False
        self.gathered: Gathered | None = None  # rank 0: every rank's figures, last gathered
        # begin()/end(): when the step in progress began, when the gap before the next
        # one began (the last step's end, or the end of other work: mark()).
        self._began: float | None = None
        self._began_cpu = 0.0
        self._gap: float | None = None
        self._gap_cpu = 0.0

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        sync = self._sync()
        self._distributed()
        barrier = self._rank_barrier()
        clock, cpu = self.clock, time.thread_time
        runq = _Runqueue()
        queued = runq.read
        waits, computes, rank_waits = self.waits, self.computes, self.rank_waits
        wait_cpu, compute_cpu, wait_runq = self.wait_cpu, self.compute_cpu, self.wait_runq
        got_cpu = 0.0
        every = self.every
        it = iter(self.iterable)
        self.iterator = type(it).__name__
        self.num_workers = getattr(it, "_num_workers", self.num_workers)
        workers = _WorkerCpu(it)
        self.worker_cpu = []
        self.passes += 1
        received = None  # when the loop got its last batch; None before the first
        try:
            while True:
                sync()
                asked, asked_cpu = clock(), cpu()
                if received is not None:
                    computes.append(asked - received)
                    compute_cpu.append(asked_cpu - got_cpu)
                    if workers and len(computes) % WORKER_SAMPLE == 1:
                        workers.sample(len(computes), self.worker_cpu)
                        asked = clock()  # reading /proc is ours: counted in neither
                    if every and len(computes) % every == 0:
                        self._checkpoint()
                        asked = clock()  # printing is ours: counted in neither figure
                asked_runq = queued()
                try:
                    item = next(it)
                except StopIteration:
                    break
                received, got_cpu = clock(), cpu()
                waits.append(received - asked)
                wait_cpu.append(got_cpu - asked_cpu)
                wait_runq.append(queued() - asked_runq)
                if barrier is not None:
                    arrived = received
                    barrier()
                    received, got_cpu = clock(), cpu()
                    rank_waits.append(received - arrived)
                yield item
        except GeneratorExit:
            # The loop stopped early (break, an exception): its last step ends now.
            if received is not None and len(computes) < len(waits):
                computes.append(clock() - received)
                compute_cpu.append(cpu() - got_cpu)
            raise
        finally:
            runq.close()
            self._drop_unfinished()
            self._pass_ended()

    def _drop_unfinished(self) -> None:
        """Forget a batch whose step never finished (the loop stopped inside it)."""
        n = len(self.computes)
        for a in (self.waits, self.wait_cpu, self.wait_runq, self.rank_waits):
            del a[n:]

    def _pass_ended(self) -> None:
        """A pass ended: print what has not been printed; under torch.distributed the
        ranks' figures are exchanged whatever `show` says (rank 0 reports them all)."""
        show = self.show and len(self.computes) != self._printed_at
        if self._distributed() is not None:
            self._exchange(final=True, show=show)
        elif show:
            self._print()
        self._printed_at = len(self.computes)

    # Trainers: the same timing from their hooks (starvecheck.integrations).

    def begin(self) -> None:
        """A step begins, its batch in hand: the time since the last `end()` (or
        `mark()`) was the data wait. The first call starts a pass."""
        if self._began is not None:  # a step never ended (hooks out of order): end it
            self.end()
        if self._gap is None:  # no start(): the pass starts with this step, no wait
            self.start()
        now, now_cpu = self.clock(), time.thread_time()
        gap = now if self._gap is None else self._gap
        self.waits.append(now - gap)
        self.wait_cpu.append(now_cpu - self._gap_cpu)
        self.wait_runq.append(0.0)
        barrier = self._rank_barrier()
        if barrier is not None:
            barrier()
            arrived, now = now, self.clock()
            now_cpu = time.thread_time()
            self.rank_waits.append(now - arrived)
        self._began, self._began_cpu = now, now_cpu
        self._gap = None

    def end(self) -> None:
        """The step that `begin()` began has ended (after the optimizer step)."""
        if self._began is None:
            return
        self._sync()()  # queued GPU work is the step's
        now, now_cpu = self.clock(), time.thread_time()
        self.computes.append(now - self._began)
        self.compute_cpu.append(now_cpu - self._began_cpu)
        self._began = None
        if self.every and len(self.computes) % self.every == 0:
            self._checkpoint()
            now, now_cpu = self.clock(), time.thread_time()  # printing is ours
        self._gap, self._gap_cpu = now, now_cpu

    def mark(self) -> None:
        """Work that is not waiting for data ended just now between two steps
        (logging, evaluation, a checkpoint): the data wait starts counting here."""
        if self._began is None:
            self._gap, self._gap_cpu = self.clock(), time.thread_time()

    def start(self) -> None:
        """A pass starts now (a trainer's epoch): the first step's wait counts from here."""
        if self._began is None:
            self._sync()
            self._distributed()
            self.passes += 1
            self._gap, self._gap_cpu = self.clock(), time.thread_time()

    def finish(self) -> None:
        """Training ended: a step left open is dropped, the report printed (rank 0)."""
        self._began = None
        self._gap = None
        self._drop_unfinished()
        self._pass_ended()

    def _checkpoint(self) -> None:
        """Every `every` steps: print (rank 0: every rank's figures so far)."""
        if self._distributed() is not None:
            self._exchange(final=False, show=True)
        else:
            self._print()
        self._printed_at = len(self.computes)

    # torch.distributed

    def _distributed(self) -> Peers | None:
        if not self._found_peers:
            from starvecheck import loopranks

            self._found_peers = True
            self.peers = loopranks.Peers.find()
        return self.peers

    def _exchange(self, *, final: bool, show: bool) -> None:
        """Publish this rank's figures; rank 0 gathers every rank's (never blocking a
        rank: see loopranks) and prints them when `show`."""
        from starvecheck import loopranks

        peers = self.peers
        assert peers is not None
        mine = loopranks.payload(self, final=final)
        if peers.rank != 0:
            peers.publish(mine)
            return
        self.gathered = peers.collect(loopranks.decode(mine))
        if show and len(self.computes):
            self._print()

    def _rank_barrier(self) -> Callable[[], object] | None:
        """dist.barrier when barrier=True and a process group is there, else None
        (with a note saying why, once)."""
        if not self.barrier:
            return None
        if self._barrier is not None:
            return self._barrier
        peers = self._distributed()
        if peers is None:
            self.barrier = False
            self.notes.append(
                Caveat(
                    "watch.barrier-without-ranks",
                    "barrier=True, but no torch.distributed process group of two or more "
                    "ranks was initialised when the loop started: nothing to wait for",
                )
            )
            return None
        import torch.distributed as dist

        self._barrier = dist.barrier
        if dist.get_backend() == "nccl":
            # NCCL's barrier guesses the device from the rank unless told; the one this
            # process uses is the current one (torch.cuda.set_device(local_rank)).
            import torch

            device = torch.cuda.current_device()
            self._barrier = lambda: dist.barrier(device_ids=[device])
        return self._barrier

    def _sync(self) -> Callable[[], None]:
        if self._synchronize is not None:
            return self._synchronize
        self._synchronize = _nothing
        if self.sync:
            import torch

            if torch.cuda.is_available():
                self._synchronize = torch.cuda.synchronize
            else:
                self.notes.append(
                    Caveat(
                        "watch.sync-without-cuda",
                        "sync=True, but torch sees no CUDA device: nothing to synchronise",
                    )
                )
        return self._synchronize

    # What it found

    def metrics(self) -> list[Metric]:
        """The loop's figures, one of a kind each and labelled with their quantity alone,
        as a trace's are (`profile --trace`): judged and shown as one step breakdown."""
        barrier = self.rank_waits if len(self.rank_waits) == len(self.waits) else None
        steps = [w + c for w, c in zip(self.waits, self.computes, strict=False)]
        if barrier is not None:
            steps = [s + b for s, b in zip(steps, barrier, strict=False)]
        out = [_single("steps", self.offset + len(steps), "steps")]
        if not steps:
            return [
                *out,
                _missing("step_ms", "ms", "no step completed"),
                _missing("data_wait_share", "fraction", "no step completed"),
            ]
        # The first step is a warm-up, left out (where it is here and others are).
        first, rest = (1, steps[1:]) if len(steps) > 1 and not self.offset else (0, steps)
        waits, computes = self.waits[first:], self.computes[first:]
        total = sum(rest)
        out += [
            _ms("step_ms", rest),
            _ms("data_wait_ms", waits),
            _ms("compute_ms", computes),
            _single("data_wait_share", sum(waits) / total if total > 0 else 0.0, "fraction"),
        ]
        if barrier is not None and len(barrier) > first:
            out.append(_ms("rank_wait_ms", barrier[first:]))
        if len(self.wait_cpu) == len(self.waits) and len(self.compute_cpu) == len(self.computes):
            out += [
                _ms("data_wait_cpu_ms", self.wait_cpu[first:]),
                _ms("compute_cpu_ms", self.compute_cpu[first:]),
            ]
            if len(self.wait_runq) == len(self.waits) and any(self.wait_runq[first:]):
                out.append(_ms("data_wait_runqueue_ms", self.wait_runq[first:]))
        per_batch = self._worker_cpu_per_batch()
        if per_batch is not None:
            out.append(_single("worker_cpu_ms", per_batch, "ms"))
        if first:
            out += [
                _single("first_step_ms", steps[0] * 1e3, "ms"),
                _single("first_wait_ms", self.waits[0] * 1e3, "ms"),
            ]
        return out

    def _worker_cpu_per_batch(self) -> float | None:
        """The worker processes' CPU milliseconds per batch, between the first and last
        sample (at least WORKER_SAMPLE steps apart)."""
        if len(self.worker_cpu) < 2:
            return None
        (s0, c0), (s1, c1) = self.worker_cpu[0], self.worker_cpu[-1]
        return (c1 - c0) / (s1 - s0) * 1e3 if s1 > s0 and c1 >= c0 else None

    def result(self) -> StageResult:
        """The measured figures, judged: the findings are what advice.judge makes of
        them, as for any command's report."""
        return self.report().stages[0]

    def parameters(self) -> dict[str, Any]:
        """How this loop was timed (what the judgement reads beside the figures)."""
        return {
            "data_wait_source": SOURCE,
            "dataloader": self.iterator,
            "sync": self.sync,
            "passes": self.passes,
            "num_workers": self.num_workers,
            "effective_cpus": _effective_cpus(),
        }

    def caveats(self) -> list[Caveat]:
        caveats = list(self.notes)
        if len(self.computes) > 1:
            caveats.append(
                Caveat(
                    "watch.warmup-left-out",
                    "the first step is left out of every figure as a warm-up (worker "
                    "start-up, CUDA context, the first prefetch)",
                )
            )
        if not self.sync and _cuda_in_use():
            caveats.append(
                Caveat(
                    "watch.unsynchronized",
                    "sync=False: on a GPU, work the step queued but did not wait for shows up "
                    "as data wait in the next next(); pass sync=True to time each step to its "
                    "end",
                )
            )
        return caveats

    def _measured(self) -> StageResult:
        """This loop's figures; on rank 0 under torch.distributed, every rank's."""
        peers = self._distributed()
        if peers is not None and peers.rank == 0:
            from starvecheck import loopranks

            if self.gathered is None:
                self.gathered = peers.collect(loopranks.decode(loopranks.payload(self, final=True)))
            return loopranks.combine(self, self.gathered)
        params = self.parameters()
        if peers is not None:
            params |= {"rank": peers.rank, "world_size": peers.world}
        return StageResult(
            stage="watch",
            parameters=params,
            metrics=tuple(self.metrics()),
            caveats=tuple(self.caveats()),
        )

    def report(self) -> Report:
        """The loop's result (labelled figures, no findings), judged once by
        advice.judge as a command's are, with the ranked checklist (and, across ranks,
        the straggler summary advice/stragglers.py states): the report the CLI would
        build (starvecheck.report.build_report)."""
        from starvecheck.context import Context
        from starvecheck.report import build_report

        return build_report("watch", None, [self._measured()], Context(stdout_isatty=False))

    def summary(self, color: bool = False, width: int | None = 100) -> str:
        """The report as the terminal shows it (the trailing blanks rich pads with cut)."""
        from starvecheck.context import Context
        from starvecheck.render.terminal import as_text

        c = Context(stdout_isatty=color, width=width, environ=os.environ)
        return as_text(self.report(), c.console())

    def _print(self) -> None:
        stream = self.file or sys.stderr
        isatty = bool(getattr(stream, "isatty", lambda: False)())
        stream.write(self.summary(color=isatty, width=None if isatty else 100))
        stream.flush()


def _nothing() -> None:
    pass


class _Runqueue:
    """Seconds the calling thread has waited on a run queue (the second field of
    /proc/thread-self/schedstat), read with one pread; always 0 where there is none."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self.read()
        except (OSError, ValueError, IndexError):
            self.close()

    def read(self) -> float:
        if self.fd is None:
            return 0.0
        try:
            return int(os.pread(self.fd, 96, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


WORKER_SAMPLE = 16  # steps between two readings of the workers' CPU time


class _WorkerCpu:
    """The CPU time of a DataLoader iterator's worker processes (its `_workers`, a
    private attribute read defensively), summed; falsy when there are none to read."""

    def __init__(self, it: object) -> None:
        procs = getattr(it, "_workers", None)
        self.pids = [p.pid for p in procs or () if getattr(p, "pid", None)]
        self.procs: list[Any] | None = None

    def __bool__(self) -> bool:
        return bool(self.pids)

    def sample(self, steps: int, into: list[tuple[int, float]]) -> None:
        try:
            import psutil

            if self.procs is None:
                self.procs = [psutil.Process(pid) for pid in self.pids]
            total = 0.0
            for p in self.procs:
                t = p.cpu_times()
                total += t.user + t.system
        except Exception:  # a worker gone (the pass ended, killed): no reading
            self.pids = []
            return
        into.append((steps, total))


def _single(quantity: str, value: float, unit: str) -> Metric:
    return Metric.single(quantity, value, unit, {"quantity": quantity})


def _missing(quantity: str, unit: str, reason: str) -> Metric:
    return Metric.missing(quantity, unit, reason, {"quantity": quantity})


def _ms(quantity: str, seconds: Iterable[float]) -> Metric:
    """A figure timed in each measured step, seconds in, ms out."""
    return Metric.repeated(quantity, [s * 1e3 for s in seconds], "ms", {"quantity": quantity})


def watch(
    iterable: Iterable[T],
    *,
    sync: bool = False,
    every: int | None = None,
    file: TextIO | None = None,
    show: bool = True,
    barrier: bool = False,
) -> Watch[T]:
    """Wrap the iterable a training loop consumes; see the module docstring."""
    return Watch(iterable, sync=sync, every=every, file=file, show=show, barrier=barrier)


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
