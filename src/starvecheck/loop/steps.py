"""A trainer's steps and passes, from its hooks (loop/trainers/): the part of the Watch
(loop/timer.py) that a Trainer or Lightning callback drives instead of a `for` loop.

`begin_step()` with the batch in hand, `end_step()` after the optimizer step (the data
wait is the time between one step's end and the next one's begin, less other work the
trainer reports with `resume_wait()`), `begin_pass()` at an epoch's start. Each step's
GPU events (loop/gpuclock.py) are recorded here as the `for` loop records them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from starvecheck.core import clocks
from starvecheck.loop.cpu import WORKER_SAMPLE, MachineCpu, Runqueue, WorkerCpu
from starvecheck.loop.samples import SIZED, sized

if TYPE_CHECKING:
    from starvecheck.loading.tap import Tap
    from starvecheck.loop.barrier import Barrier
    from starvecheck.loop.exporter import Exporter
    from starvecheck.loop.gpuclock import DeviceIdle, NoDevice
    from starvecheck.loop.ranks import Peers
    from starvecheck.loop.times import LoopTimes


class TrainerSteps:
    """Mixed into Watch: what it needs of it is declared here."""

    times: LoopTimes
    clock: Callable[[], float]
    every: int | None
    _began: float | None
    _began_cpu: float
    _began_pcpu: float
    _gap: float | None
    _gap_cpu: float
    _gap_pcpu: float
    _machine: MachineCpu | None = None  # the machine's CPU, read about once a second
    # The hooks' thread's run queue (opened on the first hook's thread, with its ident)
    # and its reading when the step began: None where a hook ran on another thread.
    _hook_runq: tuple[int, Runqueue] | None = None
    _began_runq: float | None = None
    _sized = 0  # this pass's first batches whose bytes were read
    # The workers of the last iterator the trainer made from its DataLoader (the stage
    # split's tap sees it made): their CPU read every WORKER_SAMPLE steps, as the `for`
    # loop reads its pass's, counted from the first step after it was made.
    _workers_of: object = None
    _worker_cpu: WorkerCpu | None = None
    _worker_steps = 0
    _taps: list[Tap | None] | None
    exporter: Exporter | None
    peers: Peers | None

    if TYPE_CHECKING:  # Watch's own

        def _rank_barrier(self) -> Barrier | None: ...
        def _sync(self) -> Callable[[], None]: ...
        def _events(self) -> DeviceIdle | NoDevice: ...
        def _checkpoint(self) -> None: ...
        def _distributed(self) -> Peers | None: ...

    def begin_step(self, batch: object = None) -> None:
        """A step begins, its batch in hand: the time since the last `end_step()` (or
        `resume_wait()`) was its data wait. The first call begins a pass. `batch`, where
        the trainer's hook gives it: the bytes of a pass's first batches are read (what
        a worker hands over), as the `for` loop reads them; where it gives none, the
        bytes each worker wrote of its first batches (loading/stamps.py) stand for them."""
        if self._began is not None:  # a step never ended (hooks out of order): end it
            self.end_step()
        if self._gap is None:  # no begin_pass(): the pass begins with this step, no wait
            self.begin_pass()
        t = self.times
        now, now_cpu = self.clock(), clocks.thread_time()
        gap = now if self._gap is None else self._gap
        t.waits.append(now - gap)
        t.wait_cpu.append(now_cpu - self._gap_cpu)
        t.wait_process_cpu.append(clocks.process_time() - self._gap_pcpu)
        t.wait_runq.append(0.0)
        tap = self._held()
        if tap is not None:  # the wait split by stage (loading/tap.py)
            tap.after(len(t.waits) - 1, gap, now, self._gap_cpu, self._gap_pcpu)
        barrier = self._rank_barrier()
        if barrier is not None:
            barrier.wait(len(t.waits))
            if barrier:
                arrived, now = now, self.clock()
                now_cpu = clocks.thread_time()
                t.rank_waits.append(now - arrived)
            else:
                self._rank_barrier()  # the note of why
        self._began, self._began_cpu, self._began_pcpu = now, now_cpu, clocks.process_time()
        self._began_runq = self._runq_now()
        self._gap = None
        if batch is not None and self._sized < SIZED:
            self._sized += 1
            sized(t, batch)
        elif batch is None and tap is not None and tap.nbytes > (t.batch_bytes or 0):
            t.batch_bytes = tap.nbytes  # no batch in the hook: its workers' own count
        self._events().arrived()

    def end_step(self) -> None:
        """The step that `begin_step()` began has ended (after the optimizer step)."""
        if self._began is None:
            return
        self._sync()()  # queued GPU work is the step's
        t = self.times
        now, now_cpu = self.clock(), clocks.thread_time()
        t.computes.append(now - self._began)
        t.compute_cpu.append(now_cpu - self._began_cpu)
        t.compute_process_cpu.append(clocks.process_time() - self._began_pcpu)
        queued, began = self._runq_now(), self._began_runq
        t.compute_runq.append(queued - began if queued is not None and began is not None else 0.0)
        self._began = None
        self._events().asked()
        if self._read_workers():
            now, now_cpu = self.clock(), clocks.thread_time()  # reading /proc is ours
        if self.every and len(t.computes) % self.every == 0:
            self._checkpoint()
            now, now_cpu = self.clock(), clocks.thread_time()  # printing is ours
        machine = self._machine_cpu()
        if machine is not None and machine.due():  # about once a second
            machine.read(t.others_cpus, t.process_cpus)
            now, now_cpu = self.clock(), clocks.thread_time()  # reading /proc is ours
        self._gap, self._gap_cpu, self._gap_pcpu = now, now_cpu, clocks.process_time()

    def _runq_now(self) -> float | None:
        """The seconds the hooks' thread has waited for a CPU (loop/cpu.Runqueue, opened
        on the first hook's thread); None when a hook runs on another thread."""
        me = threading.get_ident()
        if self._hook_runq is None:
            self._hook_runq = (me, Runqueue())
        ident, queue = self._hook_runq
        return queue.read() if ident == me else None

    def _machine_cpu(self) -> MachineCpu | None:
        """The machine's sampler: where the trainer loads in its own process, or beside
        the workers of the iterator last seen made (`_read_workers`). None with workers
        whose pids are not known (a trainer's first epoch, its iterator made before any
        hook): their CPU would be read as others'."""
        if self.times.num_workers != 0:
            return self._machine if self._worker_cpu else None
        if getattr(self, "_machine", None) is None:
            self._machine = MachineCpu()
        return self._machine

    def _read_workers(self) -> bool:
        """The workers' CPU, every WORKER_SAMPLE steps of the iterator the trainer last
        made from its DataLoader, and more often in its first ones (workers that end with
        the pass are gone before it ends); True where /proc was read. A new iterator: the
        last one's workers read once more where they are still there, its samples kept as
        a pass's (LoopTimes.new_pass), and the machine read beside the new workers."""
        it = getattr(self._held(), "made_it", None)
        if it is None or not self.times.num_workers:
            return False
        t = self.times
        if it is not self._workers_of:
            self._last_workers()
            t.new_pass()
            self._workers_of, self._worker_steps = it, 0
            self._worker_cpu = WorkerCpu(it)
            self._machine = MachineCpu(self._worker_cpu.pids) if self._worker_cpu else None
        self._worker_steps += 1
        workers = self._worker_cpu
        k = self._worker_steps  # its 1st, 2nd, 4th, 8th, 16th steps, then every 16th:
        due = k % WORKER_SAMPLE == 1 or (k <= WORKER_SAMPLE and not k & (k - 1))
        if workers and due:  # a pass whose workers end with it (12 steps) is read too
            workers.sample(len(t.computes), t.worker_cpu, t.worker_runq)
            return True
        return False

    def _last_workers(self) -> None:
        """The current workers' CPU read at a pass's end (the next pass begins, or the
        training ends), where they are still there: the last steps' share of it."""
        workers = self._worker_cpu
        if workers:
            t = self.times
            workers.sample(len(t.computes), t.worker_cpu, t.worker_runq)

    def resume_wait(self) -> None:
        """Work that is not waiting for data ended just now between two steps
        (logging, evaluation, a checkpoint): the data wait starts counting here."""
        if self._began is None:
            self._gap, self._gap_cpu = self.clock(), clocks.thread_time()
            self._gap_pcpu = clocks.process_time()

    def begin_pass(self) -> None:
        """A pass begins now (a trainer's epoch): its first step's wait counts from here."""
        if self._began is None:
            self._sync()
            self._distributed()
            self._last_workers()
            self.times.passes += 1
            self._sized = 0
            if self.exporter is not None:  # loop/exporter.py
                self.exporter.new_pass(self.peers.rank if self.peers else None)
            self._events().new_pass()
            self._gap, self._gap_cpu = self.clock(), clocks.thread_time()
            self._gap_pcpu = clocks.process_time()
            tap = self._held()
            if tap is not None:
                self._passed(tap)
            self.times.split.pass_starts.append(len(self.times.waits))  # split or not
            if tap is not None:
                tap.new_pass(self._gap)

    def hold_loader(self, loader: object, ahead: int) -> None:
        """The trainer's DataLoader, for the stage split: its collate_fn and
        worker_init_fn wrapped until training ends (loading/tap.py's `hold`); its
        fetcher keeps `ahead` batches ahead of the step."""
        from starvecheck.loop.splits import tap_for

        if self._taps == [None]:  # stages=False
            return
        tap = tap_for(loader, self.times.split, self.clock)
        if tap is not None:
            tap.hold(ahead)
        self._taps = [tap]

    def _held(self) -> Tap | None:
        taps = getattr(self, "_taps", None)
        return taps[0] if taps else None

    def _passed(self, tap: Tap) -> None:
        """The pass that ended: its batches split, its workers' start-up kept."""
        tap.finish()
        if (startup := tap.startup()) is not None:
            self.times.split.startups.append(startup)

    def release_loader(self) -> None:
        """Training ended: the last pass's split, and the DataLoader as it was."""
        self._last_workers()
        self._worker_cpu = self._workers_of = None
        tap = self._held()
        if tap is not None:
            self._passed(tap)
            tap.release()
        if self._hook_runq is not None:
            self._hook_runq[1].close()
            self._hook_runq = None
