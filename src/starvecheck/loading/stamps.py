"""The worker side of the stage split: a DataLoader's collate_fn and worker_init_fn,
wrapped, write each batch's times into a table the training process reads.

The table is a float64 tensor in shared memory, one block of rows a worker: a header
(the worker's birth, when worker_init_fn was called and returned, its CPU then) and a
ring of RING batch records (when the worker was free for the batch, when collate began
and ended, the CPU and run-queue seconds of the fetch, the CPU of collate). Every time
is time.perf_counter, CLOCK_MONOTONIC on Linux: one clock in every process of the
machine, so a worker's times and the training loop's compare directly.

The wrappers travel to the workers with the DataLoader's own arguments (inherited
under fork, pickled under forkserver and spawn, the table's memory with them); they
call the user's functions unchanged and never raise: a record that cannot be written
is left out, and the training process then splits nothing for that batch. A record's
sequence number is written last, so a record read before it was whole reads as absent.

At num_workers=0 the collate_fn runs in the training process itself: the wrapper keeps
the last batch's times on itself (`Stamped.here`), which the tap reads after each next().
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from starvecheck.core import clocks
from starvecheck.probe.process import own_stat

RING = 1024  # batch records a worker keeps; the tap reads each within a few steps
FIELDS = 8
SIZED = 3  # each worker's first batches whose bytes it writes (a trainer's hooks see none)
# A worker's header row (its block's row 0)
H_PID, H_BORN, H_INIT, H_READY, H_CPU, H_RUNQ = range(6)
# A batch record (rows 1..RING): its sequence number + 1 (0: empty), written last
R_SEQ, R_FREE, R_COLLATE, R_DONE, R_FETCH_CPU, R_FETCH_RUNQ, R_COLLATE_CPU, R_BYTES = range(8)

clock = clocks.perf_counter


def table(workers: int) -> Any:
    """A zeroed table for `workers` workers, in shared memory (torch is loaded: the
    caller holds a DataLoader; never imported here)."""
    torch = sys.modules["torch"]
    return torch.zeros(max(1, workers), RING + 1, FIELDS, dtype=torch.float64).share_memory_()


class Sched:
    """This thread's CPU and run-queue seconds from /proc/thread-self/schedstat (one
    pread: its first two fields, in ns); the thread's CPU time and no run queue where
    it cannot be read. Opened in the process and thread that read it."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None

    def read(self) -> tuple[float, float]:
        if self.fd is not None:
            try:
                run, wait = os.pread(self.fd, 96, 0).split()[:2]
                return int(run) / 1e9, int(wait) / 1e9
            except (OSError, ValueError):
                self.fd = None
        return clocks.thread_time(), 0.0


def born() -> float:
    """When this process started, on perf_counter's clock: /proc/self/stat's start time
    (clock ticks since boot) against CLOCK_BOOTTIME now; nan where it cannot be read."""
    read = own_stat()
    if read is None or read.start is None:
        return float("nan")
    try:
        age = clocks.clock_gettime(time.CLOCK_BOOTTIME) - read.start / os.sysconf("SC_CLK_TCK")
        return clock() - age
    except (OSError, ValueError, AttributeError):
        return float("nan")


class _Worker:
    """What one worker process keeps between its batches: its block of the table as a
    flat memoryview of doubles (an item written costs tens of nanoseconds, a numpy
    element a microsecond: a worker pays it every batch)."""

    def __init__(self, block: memoryview, sched: Sched) -> None:
        self.block = block
        self.sched = sched
        self.seq = 0
        ready = block[H_READY]
        self.free = ready if ready > 0 else float("nan")  # free since: ready, or its last batch
        self.cpu = block[H_CPU]
        self.runq = block[H_RUNQ]


def _block(shared: Any, worker: int) -> memoryview:
    """Worker `worker`'s rows of the table, flat: its header at 0, batch record r at
    r * FIELDS."""
    flat = memoryview(shared.numpy()[worker]).cast("B").cast("d")
    return flat


class Started:
    """worker_init_fn, timed: the worker's birth, the call and its return (the worker
    is ready to fetch from then). Calls the user's own, if any, unchanged."""

    def __init__(self, init: Any, shared: Any) -> None:
        self.init, self.shared = init, shared

    def __call__(self, worker_id: int) -> None:
        called = clock()
        try:
            if self.init is not None:
                self.init(worker_id)
        finally:
            try:
                head = _block(self.shared, worker_id)
                cpu, runq = Sched().read()
                head[H_PID], head[H_BORN], head[H_INIT] = os.getpid(), born(), called
                head[H_CPU], head[H_RUNQ] = cpu, runq
                head[H_READY] = clock()
            except Exception:  # ours: never the worker's failure
                pass


class Here:
    """The last batch collated in the training process itself (num_workers=0): when
    collate began and ended, the thread's and the process's CPU seconds and the thread's
    run-queue seconds when it began, and the thread's CPU seconds in it; the batch's
    bytes for the first SIZED batches (0 after them)."""

    __slots__ = (
        "collate", "collate_cpu", "cpu", "done", "nbytes", "pcpu", "runq", "sched", "seq", "tid"
    )  # fmt: skip

    def __init__(self) -> None:
        self.seq = self.nbytes = 0
        self.collate = self.done = self.cpu = self.pcpu = self.collate_cpu = self.runq = 0.0
        self.sched: Sched | None = None  # the collating thread's, opened on first use
        self.tid = 0

    def runq_now(self) -> float:
        """The calling thread's run-queue seconds (its own schedstat, reopened where
        another thread collates)."""
        tid = threading.get_ident()
        if self.sched is None or self.tid != tid:
            self.sched, self.tid = Sched(), tid
        return self.sched.read()[1]


class Stamped:
    """A DataLoader's collate_fn, timed where it runs. Calls the user's own unchanged,
    with the same argument, and returns what it returns."""

    def __init__(self, collate: Any, shared: Any) -> None:
        self.collate, self.shared = collate, shared
        self.here = Here()
        self._worker: _Worker | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"collate": self.collate, "shared": self.shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["collate"], state["shared"])  # type: ignore[misc]

    def __call__(self, data: Any) -> Any:
        c0 = clock()
        t0 = clocks.thread_time()
        p0 = clocks.process_time() if self._worker is None else 0.0
        q0 = self.here.runq_now() if self._worker is None else 0.0
        out = self.collate(data)
        c1 = clock()
        try:  # noqa: SIM105 (a batch's cost: contextlib.suppress is ten times try's)
            self._record(c0, c1, t0, p0, q0, out)
        except Exception:  # ours: never the worker's failure
            pass
        return out

    def _record(self, c0: float, c1: float, t0: float, p0: float, q0: float, out: Any) -> None:
        w = self._where()
        if w is None:  # the training process (num_workers=0)
            h = self.here
            h.collate, h.done, h.cpu, h.pcpu, h.runq = c0, c1, t0, p0, q0
            h.collate_cpu = clocks.thread_time() - t0
            h.nbytes = batch_nbytes(out) if h.seq < SIZED else 0
            h.seq += 1
            return
        cpu, runq = w.sched.read()
        collate_cpu = clocks.thread_time() - t0
        at, b = (1 + w.seq % RING) * FIELDS, w.block
        b[at + R_SEQ] = 0.0  # being written
        b[at + R_FREE], b[at + R_COLLATE], b[at + R_DONE] = w.free, c0, c1
        # The fetch's CPU: the thread's since its last batch (or since it was ready),
        # less this collate's (the reading is taken after it).
        b[at + R_FETCH_CPU] = max(0.0, cpu - w.cpu - collate_cpu)
        b[at + R_FETCH_RUNQ] = max(0.0, runq - w.runq)
        b[at + R_COLLATE_CPU] = collate_cpu
        b[at + R_BYTES] = batch_nbytes(out) if w.seq < SIZED else 0.0
        w.seq += 1
        b[at + R_SEQ] = w.seq
        w.free, w.cpu, w.runq = c1, cpu, runq

    def _where(self) -> _Worker | None:
        """This worker's state (made on its first batch); None in the training process."""
        pid = os.getpid()
        if self._worker is not None and self._pid == pid:
            return self._worker
        info = sys.modules["torch.utils.data"].get_worker_info()  # loaded: it calls us
        if info is None:
            return None
        self._pid = pid
        self._worker = _Worker(_block(self.shared, info.id), Sched())
        return self._worker


def batch_nbytes(item: object, depth: int = 4, budget: list[int] | None = None) -> int:
    """The bytes of the arrays in a batch (tensors, numpy arrays, bytes), found through
    tuples, lists and dicts at most `depth` deep and 1,000 objects in all: what crosses
    between processes when a worker hands it over. Never imports anything."""
    budget = [1000] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        return 0
    if isinstance(item, bytes | bytearray):
        return len(item)
    n = getattr(item, "nbytes", None)
    if isinstance(n, int) and not isinstance(item, type):
        return n
    if depth <= 0:
        return 0
    if isinstance(item, Mapping):
        item = list(item.values())
    if isinstance(item, tuple | list):
        return sum(batch_nbytes(x, depth - 1, budget) for x in item)
    return 0
