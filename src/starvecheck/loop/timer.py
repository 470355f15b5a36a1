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
The figures themselves are a `LoopTimes` (loop/times.py), in `.times`. The Watch is
this module's, with what is mixed in: a trainer's steps (loop/steps.py), the ranks and
the GPU kept in step (loop/synced.py), what it found (loop/reporting.py).

starvecheck's own code never raises into the loop (loop/output.py): a `file=` that can
never take the report is refused when the watch is made; a report that cannot be
written later, or any failure of ours while reporting, is one warning line on stderr.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from starvecheck.core import clocks
from starvecheck.core.metric import Caveat
from starvecheck.loop.barrier import Barrier
from starvecheck.loop.cpu import WORKER_SAMPLE, MachineCpu, Runqueue, WorkerCpu
from starvecheck.loop.exporter import start as start_exporter
from starvecheck.loop.gpuclock import Device, DeviceIdle, NoDevice
from starvecheck.loop.handover import Handover
from starvecheck.loop.headspace import Replay, steps
from starvecheck.loop.options import WatchOptions
from starvecheck.loop.output import never_raising
from starvecheck.loop.reporting import Reporting
from starvecheck.loop.samples import FirstBatches
from starvecheck.loop.splits import tap_for
from starvecheck.loop.steps import TrainerSteps
from starvecheck.loop.synced import Synced
from starvecheck.loop.times import LoopTimes

if TYPE_CHECKING:
    from starvecheck.loading.alone import Alone
    from starvecheck.loading.tap import Tap
    from starvecheck.loop.ranks import Gathered, Peers

T = TypeVar("T")


class Watch(TrainerSteps, Synced, Reporting, Generic[T]):
    """An iterable over `iterable`'s items that times the loop consuming them: a pass
    and its steps here; a trainer's steps loop/steps.py's; the ranks and the GPU kept in
    step, loop/synced.py's; what it found, loop/reporting.py's."""

    def __init__(
        self,
        iterable: Iterable[T],
        *,
        clock: Callable[[], float] = clocks.perf_counter,
        device: Device | None = None,
        **options: Any,
    ) -> None:
        o = WatchOptions(**options)  # loop/options.py: every option's default and check
        self.iterable = iterable
        self.barrier = o.barrier
        self.barrier_timeout = o.barrier_timeout
        self.every = o.every
        self.file = o.file
        self.show = o.show
        self.clock = clock
        self.times = LoopTimes(sync=o.sync)  # what is measured
        self._replay = Replay(steps(o.headspace))  # loop/headspace.py
        self._want_events, self._device = o.gpu_events, device  # loop/gpuclock.py
        self._gpu: DeviceIdle | NoDevice | None = None
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
        self._alone: dict[tuple[int, int], Alone] = {}  # once per dataset and batch size
        # the stage split's tap, once made; [None]: not asked for (stages=False)
        self._taps: list[Tap | None] | None = None if o.stages else [None]
        self._gap_cpu = 0.0
        self._gap_pcpu = 0.0
        # Prometheus (loop/exporter.py): None unless asked for, here or in the environment.
        self.exporter = start_exporter(self.times, o.prometheus, o.prometheus_addr, self._warned)

    @property
    def sync(self) -> bool:
        return self.times.sync

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        """One pass: a step's wait is the call to next(), its compute the rest of it."""
        sync = self._sync()
        self._distributed()
        barrier = self._rank_barrier()
        gpu, replay = self._events(), self._replay
        gpu.new_pass()
        clock, (cpu, pcpu, perf) = self.clock, clocks.steps()  # the real builtins themselves
        runq = Runqueue()
        queued = runq.read
        t = self.times
        waits, computes, rank_waits = t.waits, t.computes, t.rank_waits
        wait_cpu, compute_cpu, wait_runq = t.wait_cpu, t.compute_cpu, t.wait_runq
        compute_pcpu, wait_pcpu = t.compute_process_cpu, t.wait_process_cpu
        got_cpu = got_pcpu = got_runq = 0.0
        tap, it, iter_s, workers, machine, first = self._pass_begins()
        received = None  # when the loop got its last batch; None before the first
        try:
            while True:
                sync()
                asked, asked_cpu, asked_pcpu = clock(), cpu(), pcpu()
                if received is not None:
                    computes.append(asked - received)
                    compute_cpu.append(asked_cpu - got_cpu)
                    compute_pcpu.append(asked_pcpu - got_pcpu)
                    t.compute_runq.append(queued() - got_runq)
                    gpu.asked()
                    if replay.due(len(computes)):  # the step with no data wait, apart
                        yield from replay.run(t.headspace, clock, self._replay_sync())
                        gpu.new_pass()
                        asked, asked_cpu, asked_pcpu = clock(), cpu(), pcpu()
                    if workers and len(computes) % WORKER_SAMPLE == 1:
                        workers.sample(len(computes), t.worker_cpu, t.worker_runq)
                        asked = clock()  # reading /proc is ours: counted in neither
                    if perf() >= machine.next_at:  # about once a second, never per step
                        machine.read(t.others_cpus, t.process_cpus)
                        asked = clock()
                    if self.every and len(computes) % self.every == 0:
                        self._checkpoint()
                        asked = clock()  # printing is ours: counted in neither figure
                else:  # the pass's first wait: iter() too
                    asked -= iter_s
                asked_runq = queued()
                if tap is not None:
                    tap.before(it)
                try:
                    item = next(it)
                except StopIteration:
                    break
                received, got_cpu = clock(), cpu()
                waits.append(received - asked)
                wait_cpu.append(got_cpu - asked_cpu)
                wait_pcpu.append(pcpu() - asked_pcpu)
                wait_runq.append((got_runq := queued()) - asked_runq)
                if tap is not None:  # the wait split by stage (loading/tap.py)
                    tap.after(len(waits) - 1, asked, received, asked_cpu, asked_pcpu, asked_runq)
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
                replay.keep(item)
                gpu.arrived()
                yield item
        except GeneratorExit:
            # The loop stopped early (break, an exception): its last step ends now.
            if received is not None and len(computes) < len(waits):
                runq_s = queued() - got_runq
                t.stopped_inside(clock() - received, cpu() - got_cpu, pcpu() - got_pcpu, runq_s)
            raise
        finally:
            self._pass_over(workers, runq, tap)

    def _pass_begins(
        self,
    ) -> tuple[Tap | None, Iterator[T], float, WorkerCpu, MachineCpu, FirstBatches]:
        """A pass's iterator and what reads beside it: (the stage split's tap, the
        iterator, the seconds iter() took (the pass's first wait counts them: workers
        start there), its workers' CPU, the machine's, the first batches' reader)."""
        t, clock = self.times, self.clock
        if self._taps is None:  # made once (loop/splits.py)
            self._taps = [tap_for(self.iterable, t.split, clock)]
        tap = self._taps[0]
        began = clock()
        it = tap.begin(began) if tap is not None else iter(self.iterable)
        iter_s = clock() - began
        t.split.pass_starts.append(len(t.waits))
        t.iterator = type(it).__name__
        t.num_workers = getattr(it, "_num_workers", t.num_workers)
        workers = WorkerCpu(it)
        machine = MachineCpu(workers.pids)  # the others' CPUs beside this pass's workers
        self._new_pass(t)
        return tap, it, iter_s, workers, machine, FirstBatches(t, self.iterable)

    def _new_pass(self, t: LoopTimes) -> None:
        t.new_pass()
        t.passes += 1
        if self.exporter is not None:  # its pass's first step (loop/exporter.py)
            self.exporter.new_pass(self.peers.rank if self.peers else None)

    def _pass_over(self, workers: WorkerCpu, runq: Runqueue, tap: Tap | None = None) -> None:
        with never_raising(self._warned, "end the pass"):
            if tap is not None:
                tap.finish()
                if (startup := tap.startup()) is not None:
                    self.times.split.startups.append(startup)
                if tap.broken and not any(c.id == SPLIT_STOPPED for c in self.times.notes):
                    said = f"the wait's split by stage stopped: {tap.broken}"
                    self.times.notes.append(Caveat(SPLIT_STOPPED, said))
            if workers:  # the pass's last reading, where its workers are still there
                workers.sample(len(self.times.computes), self.times.worker_cpu,
                               self.times.worker_runq)  # fmt: skip
            runq.close()
        self.end_pass()

    def end_pass(self) -> None:
        """A pass ended (a `for` over the watch; a trainer's training): a step left open
        is dropped, and what has not been printed is printed (rank 0). Under
        torch.distributed the ranks' figures are exchanged whatever `show` says."""
        self._began = None
        self._gap = None
        self.times.drop_unfinished()
        self._read_gpu()
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
        self._read_gpu()
        with never_raising(self._warned, "write its report"):
            if self._distributed() is not None:
                self._exchange(final=False, show=True)
            else:
                self._print()


SPLIT_STOPPED = "watch.split-stopped"


def watch(iterable: Iterable[T], **options: Any) -> Watch[T]:
    """Wrap the iterable a training loop consumes; see the module docstring and
    loop/options.WatchOptions for the options."""
    return Watch(iterable, **options)
