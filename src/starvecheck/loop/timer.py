"""`starvecheck.watch(loader)`: how long your own training loop waits for data.

Wrap the iterable your loop already uses; nothing else changes:

    for batch in starvecheck.watch(loader, sync=True):
        train_step(batch)

Two lifecycles. A *step* is one batch: its data wait, then its compute. A *pass* is
one iteration over the loader: one `for` over the watch (a trainer's epoch). For each
step it times two things with `time.perf_counter`:

  wait     the call to `next()` on your iterable: the loop waits for data
  compute  from receiving a batch to asking for the next one: your step

so a step is wait + compute and the data-wait share is the summed waits over the
summed steps. With `sync=True` it calls `torch.cuda.synchronize()` before it starts
timing each wait, so a step's queued GPU work counts as compute instead of showing
up later as time spent in `next()`. The first step (worker start-up, CUDA
context, first-batch prefetch) is left out of every figure and reported on its own.

Trainers drive the same timing from their hooks (loop/trainers/): `begin_step()` with
the batch in hand, `end_step()` after the optimizer step (the data wait is the time
between one step's end and the next one's begin, less other work the trainer reports
with `resume_wait()`), `begin_pass()` at an epoch's start, `end_pass()` when training
ends.

Under torch.distributed (a process group initialised when the loop starts) each rank
times its own loop and rank 0 reports every rank (loop/ranks.py). `barrier=True` adds
a timed barrier once each batch has arrived, so what the other ranks lose waiting for
a slow rank's data is measured there (`rank_wait_ms`) rather than estimated; a barrier
that waits past `barrier_timeout` seconds is given up (loop/barrier.py).

At the end of each pass (and every `every` steps) it prints the step breakdown and
the checklist that `starvecheck profile --trace` gives for a trace, to stderr, or
returns it: `report()`, `result()`, `summary()`. The report is built, judged and
rendered as a command's is (starvecheck.advice.report, render.terminal). The per-step cost
is a few perf_counter calls and two array appends (see benchmarks/watch_overhead.py).
The figures themselves are a `LoopTimes` (loop/times.py), in `.times`.

starvecheck's own code never raises into the loop (loop/output.py): a `file=` that can
never take the report is refused when the watch is made; a report that cannot be
written later, or any failure of ours while reporting, is one warning line on stderr.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Generic, TextIO, TypeVar

from starvecheck.core.metric import Caveat
from starvecheck.core.model import Report, StageResult
from starvecheck.loop.barrier import DEFAULT_TIMEOUT_S, Barrier
from starvecheck.loop.cpu import WORKER_SAMPLE, Runqueue, WorkerCpu
from starvecheck.loop.handover import Handover, worth_measuring
from starvecheck.loop.handover import measure as measure_handover
from starvecheck.loop.output import check_file, never_raising
from starvecheck.loop.samples import FirstBatches
from starvecheck.loop.times import LoopTimes

if TYPE_CHECKING:
    from starvecheck.loop.ranks import Gathered, Peers

T = TypeVar("T")


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
        barrier_timeout: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be a positive number of steps, not {every!r}")
        if not isinstance(barrier_timeout, int | float) or not 0 < barrier_timeout < 1e9:
            raise ValueError(
                f"barrier_timeout must be a positive number of seconds, not {barrier_timeout!r}"
            )
        check_file(file)
        self.iterable = iterable
        self.barrier = barrier
        self.barrier_timeout = float(barrier_timeout)
        self.every = every
        self.file = file
        self.show = show
        self.clock = clock
        self.times = LoopTimes(sync=sync)  # what is measured
        self._synchronize: Callable[[], None] | None = None
        self._barrier: Barrier | None = None
        self._warned: set[str] = set()  # what the loop was warned of (loop/output.py)
        self._printed_at = 0  # steps completed when the report was last printed
        self.peers: Peers | None = None  # the other ranks, under torch.distributed
        self._found_peers = False
        self.gathered: Gathered | None = None  # rank 0: every rank's figures, last gathered
        # Trainers' steps: when the step in progress began, and when the gap before the
        # next one began (the last step's end, or the end of other work: resume_wait()).
        self._began: float | None = None
        self._began_cpu = self._began_pcpu = 0.0
        self._gap: float | None = None
        self._handover: dict[int, Handover | None] = {}  # measured once per batch size
        self._gap_cpu = 0.0
        self._gap_pcpu = 0.0

    @property
    def sync(self) -> bool:
        return self.times.sync

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        """One pass: each step's wait is the call to next(), its compute the time until
        the loop asks for the next batch."""
        sync = self._sync()
        self._distributed()
        barrier = self._rank_barrier()
        clock, cpu, pcpu = self.clock, time.thread_time, time.process_time
        runq = Runqueue()
        queued = runq.read
        t = self.times
        waits, computes, rank_waits = t.waits, t.computes, t.rank_waits
        wait_cpu, compute_cpu, wait_runq = t.wait_cpu, t.compute_cpu, t.wait_runq
        compute_pcpu, wait_pcpu = t.compute_process_cpu, t.wait_process_cpu
        got_cpu = got_pcpu = 0.0
        every = self.every
        it = iter(self.iterable)
        t.iterator = type(it).__name__
        t.num_workers = getattr(it, "_num_workers", t.num_workers)
        workers = WorkerCpu(it)
        t.new_pass()
        t.passes += 1
        first = FirstBatches(t, self.iterable)  # their bytes, their samples' digests
        received = None  # when the loop got its last batch; None before the first
        try:
            while True:
                sync()
                asked, asked_cpu, asked_pcpu = clock(), cpu(), pcpu()
                if received is not None:
                    computes.append(asked - received)
                    compute_cpu.append(asked_cpu - got_cpu)
                    compute_pcpu.append(asked_pcpu - got_pcpu)
                    if workers and len(computes) % WORKER_SAMPLE == 1:
                        workers.sample(len(computes), t.worker_cpu, t.worker_runq)
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
                wait_pcpu.append(pcpu() - asked_pcpu)
                wait_runq.append(queued() - asked_runq)
                if first.left:  # reading the first batches is ours: counted in neither
                    first.read(item)
                    received, got_cpu = clock(), cpu()
                got_pcpu = pcpu()
                if barrier is not None:
                    barrier.wait(len(waits))
                    if barrier:
                        arrived = received
                        received, got_cpu = clock(), cpu()
                        rank_waits.append(received - arrived)
                    else:  # given up: the wait is the step's, as without a barrier
                        barrier = self._rank_barrier()
                yield item
        except GeneratorExit:
            # The loop stopped early (break, an exception): its last step ends now.
            if received is not None and len(computes) < len(waits):
                computes.append(clock() - received)
                compute_cpu.append(cpu() - got_cpu)
                compute_pcpu.append(pcpu() - got_pcpu)
            raise
        finally:
            with never_raising(self._warned, "end the pass"):
                if workers:  # the pass's last reading, where its workers are still there
                    workers.sample(len(computes), t.worker_cpu, t.worker_runq)
                runq.close()
            self.end_pass()

    # A trainer's steps and passes, from its hooks (loop/trainers/).

    def begin_step(self) -> None:
        """A step begins, its batch in hand: the time since the last `end_step()` (or
        `resume_wait()`) was its data wait. The first call begins a pass."""
        if self._began is not None:  # a step never ended (hooks out of order): end it
            self.end_step()
        if self._gap is None:  # no begin_pass(): the pass begins with this step, no wait
            self.begin_pass()
        t = self.times
        now, now_cpu = self.clock(), time.thread_time()
        gap = now if self._gap is None else self._gap
        t.waits.append(now - gap)
        t.wait_cpu.append(now_cpu - self._gap_cpu)
        t.wait_process_cpu.append(time.process_time() - self._gap_pcpu)
        t.wait_runq.append(0.0)
        barrier = self._rank_barrier()
        if barrier is not None:
            barrier.wait(len(t.waits))
            if barrier:
                arrived, now = now, self.clock()
                now_cpu = time.thread_time()
                t.rank_waits.append(now - arrived)
            else:
                self._rank_barrier()  # the note of why
        self._began, self._began_cpu, self._began_pcpu = now, now_cpu, time.process_time()
        self._gap = None

    def end_step(self) -> None:
        """The step that `begin_step()` began has ended (after the optimizer step)."""
        if self._began is None:
            return
        self._sync()()  # queued GPU work is the step's
        t = self.times
        now, now_cpu = self.clock(), time.thread_time()
        t.computes.append(now - self._began)
        t.compute_cpu.append(now_cpu - self._began_cpu)
        t.compute_process_cpu.append(time.process_time() - self._began_pcpu)
        self._began = None
        if self.every and len(t.computes) % self.every == 0:
            self._checkpoint()
            now, now_cpu = self.clock(), time.thread_time()  # printing is ours
        self._gap, self._gap_cpu, self._gap_pcpu = now, now_cpu, time.process_time()

    def resume_wait(self) -> None:
        """Work that is not waiting for data ended just now between two steps
        (logging, evaluation, a checkpoint): the data wait starts counting here."""
        if self._began is None:
            self._gap, self._gap_cpu = self.clock(), time.thread_time()
            self._gap_pcpu = time.process_time()

    def begin_pass(self) -> None:
        """A pass begins now (a trainer's epoch): its first step's wait counts from here."""
        if self._began is None:
            self._sync()
            self._distributed()
            self.times.passes += 1
            self._gap, self._gap_cpu = self.clock(), time.thread_time()
            self._gap_pcpu = time.process_time()

    def end_pass(self) -> None:
        """A pass ended (a `for` over the watch; a trainer's training): a step left open
        is dropped, and what has not been printed is printed (rank 0). Under
        torch.distributed the ranks' figures are exchanged whatever `show` says."""
        self._began = None
        self._gap = None
        self.times.drop_unfinished()
        steps = len(self.times.computes)
        show = self.show and steps != self._printed_at
        self._printed_at = steps
        with never_raising(self._warned, "write its report"):
            if self._distributed() is not None:
                self._exchange(final=True, show=show)
            elif show:
                self._print()

    def _checkpoint(self) -> None:
        """Every `every` steps: print (rank 0: every rank's figures so far)."""
        self._printed_at = len(self.times.computes)
        with never_raising(self._warned, "write its report"):
            if self._distributed() is not None:
                self._exchange(final=False, show=True)
            else:
                self._print()

    # torch.distributed

    def _distributed(self) -> Peers | None:
        if not self._found_peers:
            from starvecheck.loop.ranks import Peers

            self._found_peers = True
            self.peers = Peers.find()
        return self.peers

    def _exchange(self, *, final: bool, show: bool) -> None:
        """Post this rank's figures; rank 0 gathers every rank's (never blocking a
        rank: see loop/ranks.py) and prints them when `show`."""
        assert self.peers is not None
        gathered = self.peers.post(self.times, final=final)
        if gathered is None:  # not rank 0
            return
        self.gathered = gathered
        if show and len(self.times.computes):
            self._print()

    def _rank_barrier(self) -> Barrier | None:
        """The barrier when barrier=True and a process group is there, else None (with
        a note saying why, once): none either once it was given up (loop/barrier.py)."""
        if not self.barrier:
            return None
        if self._barrier is not None:
            if self._barrier:
                return self._barrier
            self.barrier = False
            assert self._barrier.gave_up is not None
            self.times.notes.append(self._barrier.gave_up)
            return None
        peers = self._distributed()
        if peers is None:
            self.barrier = False
            self.times.notes.append(
                Caveat(
                    "watch.barrier-without-ranks",
                    "barrier=True, but no torch.distributed process group of two or more "
                    "ranks was initialised when the loop started: nothing to wait for",
                )
            )
            return None
        self._barrier = Barrier.make(self.barrier_timeout, peers.rank)
        return self._rank_barrier()

    def _sync(self) -> Callable[[], None]:
        if self._synchronize is not None:
            return self._synchronize
        self._synchronize = _nothing
        if self.sync:
            import torch

            if torch.cuda.is_available():
                self._synchronize = torch.cuda.synchronize
            else:
                self.times.notes.append(
                    Caveat(
                        "watch.sync-without-cuda",
                        "sync=True, but torch sees no CUDA device: nothing to synchronise",
                    )
                )
        return self._synchronize

    # What it found

    def measured(self) -> StageResult:
        """This loop's figures, not yet judged; on rank 0 under torch.distributed,
        every rank's."""
        peers = self._distributed()
        if peers is not None and peers.rank == 0:
            from starvecheck.loop.ranks import combine

            if self.gathered is None:
                self.gathered = peers.post(self.times, final=True)
            assert self.gathered is not None
            return combine(self.times, peers.rank, self.gathered)
        if peers is None:
            self._measure_handover()
        params = self.times.parameters()
        if peers is not None:
            params |= {"rank": peers.rank, "world_size": peers.world}
        return StageResult(
            stage="watch",
            parameters=params,
            metrics=tuple(self.times.metrics()),
            caveats=tuple(self.times.caveats()),
        )

    def _measure_handover(self) -> None:
        """What handing this loop's batches from a worker would cost, measured once per
        batch size where the loop loads in its own process, waits for data and its
        batches are large: the worker model needs it (advice/workers). With workers the
        loop's own figures hold it (its CPU receiving each batch): one figure for it."""
        t = self.times
        size = t.batch_bytes
        if t.num_workers:  # with workers the hand-over is in the loop's own figures
            return
        if size is None or not worth_measuring(size, t.waits, t.computes):
            return
        if size not in self._handover:
            self._handover[size] = measure_handover(size)
        h = self._handover[size]
        t.handover_ms = None if h is None else (h.worker_ms, h.main_ms)

    def report(self) -> Report:
        """The loop's result, judged once as a command's is, with the ranked checklist:
        the report the CLI would build (starvecheck.advice.report.build_report)."""
        from starvecheck.advice.report import build_report
        from starvecheck.core.context import Context

        return build_report("watch", None, [self.measured()], Context(stdout_isatty=False))

    def result(self) -> StageResult:
        """The measured figures, judged: the findings are what advice.judge makes of
        them, as for any command's report."""
        return self.report().stages[0]

    def summary(self, color: bool = False, width: int | None = 100) -> str:
        """The report as the terminal shows it (the trailing blanks rich pads with cut)."""
        from starvecheck.core.context import Context
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


def watch(
    iterable: Iterable[T],
    *,
    sync: bool = False,
    every: int | None = None,
    file: TextIO | None = None,
    show: bool = True,
    barrier: bool = False,
    barrier_timeout: float = DEFAULT_TIMEOUT_S,
) -> Watch[T]:
    """Wrap the iterable a training loop consumes; see the module docstring."""
    return Watch(
        iterable,
        sync=sync,
        every=every,
        file=file,
        show=show,
        barrier=barrier,
        barrier_timeout=barrier_timeout,
    )
