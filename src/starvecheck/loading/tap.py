"""The training process's side of the stage split, for one DataLoader.

`Tap.of(loader)` where the loop iterates a torch DataLoader (torch already loaded: it
is never imported here); `tap.begin(now)` makes the pass's iterator with the timed
collate_fn and worker_init_fn (loading/stamps.py) set on the DataLoader only while
`iter()` runs, then put back: the user's DataLoader object is as it was, and only the
workers made for this iterator carry the wrappers. Each step, `before()` notes which
worker the next batch comes from (the iterator's own record of the task, read without
changing it; in turn where it has none), and `after(asked, received, ...)` reads that
batch's record and returns the wait split over the stages (loading/split.py) and each
stage's busy time, or None where it could not be split (no record of that batch: a
persistent worker made before the watch, an iterator of another kind).

Persistent workers outlive a pass: the tap keeps its table for the iterator it made,
and the count of batches each worker has delivered, so a later pass's records still
match. What it costs a step: a dictionary lookup before next(), one record read and a
few subtractions after (benchmarks/watch_overhead.py).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from starvecheck.loading import split as arith
from starvecheck.loading import stamps
from starvecheck.loading.split import INDEX
from starvecheck.loading.stamps import (
    H_BORN,
    H_INIT,
    H_READY,
    R_BYTES,
    R_COLLATE,
    R_COLLATE_CPU,
    R_DONE,
    R_FETCH_CPU,
    R_FETCH_RUNQ,
    R_FREE,
    R_SEQ,
    RING,
)


def start_method(loader: Any) -> str | None:
    """How the DataLoader's workers are started: its multiprocessing_context's method,
    else this interpreter's default (fork on Linux before Python 3.14, forkserver from
    3.14); None at num_workers=0."""
    if not getattr(loader, "num_workers", 0):
        return None
    context = getattr(loader, "multiprocessing_context", None)
    if context is not None:
        name = getattr(context, "_name", None) or (context if isinstance(context, str) else None)
        if isinstance(name, str):
            return name
    try:
        return multiprocessing.get_start_method(allow_none=True) or (
            multiprocessing.get_context().get_start_method()
        )
    except (RuntimeError, ValueError):
        return None


@dataclass(frozen=True)
class Startup:
    """A pass's worker start-up, seconds from the pass's start: the slowest worker
    ready, the workers' mean, and the means of their birth to worker_init_fn (the
    interpreter, its imports and, under forkserver and spawn, the dataset unpickled)
    and of worker_init_fn itself."""

    slowest_s: float
    mean_s: float
    unpickle_s: float | None
    init_s: float | None
    workers: int


_HANDOVER = INDEX[arith.LoadStage.HANDOVER]


class Sink(Protocol):
    """Where a step's split goes: its exposed seconds and busy seconds by stage, in
    split.STAGES' order, and its batch's seconds made alone (split.solo)."""

    def put(self, step: int, exposed: list[float], busy: list[float], solo: float) -> None: ...


@dataclass(frozen=True, slots=True)
class _Pending:
    step: int
    asked: float
    received: float
    batch: arith.Batch


class Tap:
    """One DataLoader's stage split (see the module's docstring)."""

    def __init__(self, loader: Any, sink: Sink) -> None:
        # accelerate's DataLoaderShard wraps the DataLoader it iterates (its
        # `base_dataloader`, whose class it says it is): the wrappers go on that one.
        inner = getattr(loader, "__dict__", {}).get("base_dataloader")
        self.outer = loader  # what the loop iterates
        self.loader = inner if inner is not None else loader  # the DataLoader itself
        self.sink = sink
        self.pending: dict[int, _Pending] = {}  # worker -> its last batch, not yet split
        loader = self.loader
        self.workers = int(getattr(loader, "num_workers", 0) or 0)
        # pin_memory does nothing without a CUDA device (torch says so, once)
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        available = getattr(cuda, "is_available", lambda: False)
        self.pinned = bool(getattr(loader, "pin_memory", False)) and bool(available())
        self.persistent = bool(getattr(loader, "persistent_workers", False)) and self.workers > 0
        self.method = start_method(loader)
        self.shared: Any = None
        self.rows: Any = None  # the table as numpy
        self.stamped: stamps.Stamped | None = None
        self.it: Any = None
        self.counts = [0] * max(1, self.workers)  # batches received from each worker
        self.live = False  # this pass's batches carry records
        self.began = self.made = 0.0
        self.index = 0  # batches received this pass
        self.sent: deque[float] = deque()  # the last receive times (a send each)
        self.ahead = 0  # tasks the iterator keeps outstanding (prefetch x workers)
        self.worker = 0  # the worker of the batch expected next
        self.seen: set[int] = set()  # workers whose first batch of the pass came
        self.here_seq = 0
        self.broken: str | None = None  # why the split stopped, where it did
        self.held: tuple[Any, Any] | None = None  # a trainer's: the functions we replaced
        self.ahead_fetched = 0  # a trainer's fetcher: batches it keeps ahead
        self.skip = 0  # batches of this pass fetched in no wait of their own
        self.by_order = False  # batches matched with waits by order, not by the iterator
        self.made_it: Any = None  # a trainer's: the last iterator made from the loader
        self.nbytes = 0  # the largest of the first batches (stamps.SIZED), where counted

    @classmethod
    def of(cls, iterable: Any, sink: Sink) -> Tap | None:
        """A tap where `iterable` is a torch DataLoader; None for anything else."""
        torch = sys.modules.get("torch")
        data = getattr(getattr(torch, "utils", None), "data", None)
        loader_type = getattr(data, "DataLoader", None)
        if loader_type is None or not isinstance(iterable, loader_type):
            return None
        return cls(iterable, sink)

    def begin(self, now: float) -> Any:
        """This pass's iterator, made with the wrappers where new workers start (or,
        at num_workers=0, collate runs here); the plain iterator where they cannot be
        set (the pass is then not split)."""
        self.finish()  # a pass ended without saying so (a `break`)
        self.began, self.index, self.seen = now, 0, set()
        self.sent = deque()
        loader = self.loader
        # An adapter's iterator keeps a batch ahead (accelerate's): matched by order.
        self.by_order = self.outer is not loader
        self.skip = self.ahead_fetched = 1 if self.by_order else 0
        if getattr(loader, "in_order", True) is False:  # batches come as they are made:
            self.live = False  # the iterator's next task need not be the batch received
            return self._made(iter(self.outer))
        existing = getattr(loader, "_iterator", None) if self.persistent else None
        if existing is not None:  # persistent workers: ours only if we made them
            it = iter(self.outer)
            self.live = it is self.it and self.shared is not None
            return self._made(it)
        old_collate, old_init = loader.collate_fn, loader.worker_init_fn
        try:
            if self.workers:
                # New workers: a table of their own, made before they start (they write
                # their headers while iter() still runs: under forkserver and spawn
                # iter() sends each the dataset, and the first may be ready before it
                # returns); the last pass's workers may still be writing to theirs.
                self.shared = stamps.table(self.workers)
                self.rows = self.shared.numpy()
                self.counts = [0] * self.workers
            self.stamped = stamps.Stamped(old_collate, self.shared)
            loader.collate_fn = self.stamped
            if self.workers:
                loader.worker_init_fn = stamps.Started(old_init, self.shared)
        except Exception:  # a DataLoader that will not take them: not split
            self._put_back(old_collate, old_init)
            self.live = False
            return self._made(iter(self.outer))
        try:
            it = iter(self.outer)
        finally:
            self._put_back(old_collate, old_init)
        self.live = True
        self.it = it
        return self._made(it)

    # A trainer's loop (the callbacks): the trainer makes each pass's iterator itself,
    # so the wrappers stay on its DataLoader for the training (`hold`, `release`), and
    # each wait is matched with a batch by order: a fetcher that keeps `ahead` batches
    # ahead receives the pass's batch k + ahead in its k-th wait (its first wait, the
    # first ahead + 1), and batch j comes from worker j mod num_workers.

    def hold(self, ahead: int | None) -> None:
        """Set the wrappers on the DataLoader until `release()`: every iterator made
        from it from now on carries them. `ahead`: a trainer's fetcher keeps that many
        batches ahead (waits matched by order); None: each batch is matched by the
        iterator's own record, `before()` given the iterator (`loader --factory`, which
        iterates its own DataLoader)."""
        loader = self.loader
        self.held = (loader.collate_fn, loader.worker_init_fn)
        self.ahead_fetched, self.by_order = ahead or 0, ahead is not None
        try:
            if self.workers:
                self.shared = stamps.table(self.workers)
                self.rows = self.shared.numpy()
            self.stamped = stamps.Stamped(self.held[0], self.shared)
            loader.collate_fn = self.stamped
            if self.workers:
                loader.worker_init_fn = stamps.Started(self.held[1], self.shared)
                self._stamp_iterators(loader)
        except Exception as e:  # a DataLoader that will not take them: not split
            self.release()
            self.broken = f"{type(e).__name__}: {e}"
            return
        self.live = True

    def _stamp_iterators(self, loader: Any) -> None:
        """When each iterator made from `loader` is ready (its `_get_iterator` returned):
        only then does a new worker get its first indices (under forkserver and spawn,
        seconds after the first worker is ready), so a first batch's fetch begins no
        earlier (`made`); until then the worker's wait is start-up, not the fetch's."""
        made = loader._get_iterator
        tap = self

        def stamped_iterator(*args: Any, **kwargs: Any) -> Any:
            it = made(*args, **kwargs)
            tap.made = stamps.clock()
            tap.made_it = it  # its workers' CPU is read beside the hooks (loop/steps.py)
            return it

        loader.__dict__["_get_iterator"] = stamped_iterator

    def own_collate(self) -> Any:
        """The DataLoader's own collate_fn, ours unwrapped where it is on."""
        collate = getattr(self.loader, "collate_fn", None)
        return collate.collate if isinstance(collate, stamps.Stamped) else collate

    def release(self) -> None:
        """The DataLoader's own collate_fn and worker_init_fn back (training ended)."""
        if self.held is not None:
            self._put_back(*self.held)
            self.held = None
            with contextlib.suppress(Exception):
                vars(self.loader).pop("_get_iterator", None)  # the class's again
            self.made_it = None

    def new_pass(self, now: float) -> None:
        """A trainer's pass begins (its iterator is made next): new workers unless
        persistent ones were made already."""
        self.finish()
        self.began = self.made = now
        self.index, self.seen, self.sent = 0, set(), deque()
        prefetch = getattr(self.loader, "prefetch_factor", None)
        self.ahead = (prefetch if isinstance(prefetch, int) else 2) * self.workers
        if not self.persistent:
            self.counts = [0] * max(1, self.workers)
        self.skip = self.ahead_fetched
        if self.stamped is not None:
            self.here_seq = self.stamped.here.seq

    def _put_back(self, collate: Any, init: Any) -> None:
        for name, value in (("collate_fn", collate), ("worker_init_fn", init)):
            with contextlib.suppress(Exception):  # it took ours: it takes its own back
                setattr(self.loader, name, value)

    def _made(self, it: Any) -> Any:
        from starvecheck.loading.stamps import clock

        self.made = clock()
        self.ahead = int(getattr(it, "_prefetch_factor", 0) or 0) * self.workers
        if self.stamped is not None:
            self.here_seq = self.stamped.here.seq
        return it

    def before(self, it: Any) -> None:
        """Which worker the next batch comes from: the iterator's record of the task it
        will return next, else the next in turn."""
        if not self.workers or self.by_order:
            return
        info = None
        try:  # noqa: SIM105 (a step's cost: contextlib.suppress is ten times try's)
            info = it._task_info.get(it._rcvd_idx)
        except Exception:
            pass
        self.worker = info[0] if info else self.index % self.workers

    def after(
        self,
        step: int,
        asked: float,
        received: float,
        asked_cpu: float,
        asked_pcpu: float,
        asked_runq: float = 0.0,
    ) -> None:
        """The wait [asked, received] of step `step` for the batch just received: its
        split (exposed) and each stage's busy time for it go to the sink, at once at
        num_workers=0, else once the same worker's next batch is read (its hand-over
        is shared with that batch's work: split.held) or the pass ends (`finish`).
        `asked_cpu`, `asked_pcpu`, `asked_runq`: the loop thread's and the process's CPU
        seconds and the thread's run-queue seconds when it asked (at num_workers=0 the
        fetch's CPU is counted from them)."""
        if not self.live:
            return
        if self.workers and self.by_order:  # matched by order (see `hold`)
            for _ in range(self.skip):  # fetched in this wait, used in later steps
                self.counts[self.index % self.workers] += 1
                self.index += 1
                self.sent.append(asked)
            self.skip = 0
            self.worker = self.index % self.workers
        try:
            if not self.workers:
                self._here(step, asked, received, asked_cpu, asked_pcpu, asked_runq)
            else:
                self._worker_batch(step, asked, received)
        except Exception as e:  # ours: never the loop's failure; the split stops here
            self.live, self.broken = False, f"{type(e).__name__}: {e}"

    def _worker_batch(self, step: int, asked: float, received: float) -> None:
        w = self.worker
        self.index += 1
        sent = self.sent[0] if len(self.sent) >= self.ahead > 0 else self.made
        self.sent.append(received)
        if len(self.sent) > self.ahead:
            self.sent.popleft()
        if not 0 <= w < self.workers:
            return
        n = self.counts[w]
        self.counts[w] = n + 1
        rec = self.rows[w, 1 + n % RING].tolist()
        if rec[R_SEQ] != n + 1:
            self._settle(w, None)
            return
        ready = None
        if w not in self.seen:
            self.seen.add(w)
            head_ready = float(self.rows[w, 0, H_READY])
            if head_ready >= self.began:  # started this pass (not a persistent one)
                ready = head_ready
        if rec[R_BYTES] > self.nbytes:  # a worker's first batches only
            self.nbytes = int(rec[R_BYTES])
        free = rec[R_FREE]
        free = sent if math.isnan(free) else max(free, sent)
        b = arith.Batch(
            free=free,
            collate=rec[R_COLLATE],
            done=rec[R_DONE],
            fetch_cpu=rec[R_FETCH_CPU] + rec[R_FETCH_RUNQ],
            collate_cpu=rec[R_COLLATE_CPU],
            ready=ready,
            fetch_runq=rec[R_FETCH_RUNQ],
        )
        self._settle(w, b)
        self.pending[w] = _Pending(step, asked, received, b)
        made = getattr(self.sink, "made", None)
        if made is not None:  # when each batch was made, by whom (loader --factory's rate)
            made(w, b.done, b.done - (b.free if ready is None else max(b.free, ready)))

    def _settle(self, w: int, nxt: arith.Batch | None) -> None:
        """Worker `w`'s previous batch, split now that its next is known (or not): the
        workers' batches made while it was handed over (its worker's next, the others'
        latest) are what held its hand-over back, where they computed."""
        p = self.pending.pop(w, None)
        if p is None:
            return
        out = arith.exposed(p.asked, p.received, p.batch)
        busy = [nxt] if nxt is not None else []
        busy += [q.batch for v, q in self.pending.items() if v != w]
        out = arith.held(out, p.asked, p.received, p.batch, busy)
        self.sink.put(p.step, out, arith.busy(p.batch, out[_HANDOVER]), arith.solo(p.batch))

    def finish(self) -> None:
        """The pass ended: the batches whose worker sends no next one, split as they are."""
        try:
            for w in list(self.pending):
                self._settle(w, None)
        except Exception as e:  # ours: never the loop's failure
            self.live, self.broken = False, f"{type(e).__name__}: {e}"
        self.pending.clear()

    def _here(
        self,
        step: int,
        asked: float,
        received: float,
        asked_cpu: float,
        asked_pcpu: float,
        asked_runq: float,
    ) -> None:
        """num_workers=0: the batch collated in this process during the wait. The
        fetch's CPU is the thread's, or the whole process's where torch's intra-op
        threads did more of it (a transform's tensor operations), to its wall time."""
        assert self.stamped is not None
        h = self.stamped.here
        if h.seq != self.here_seq + 1 or not asked <= h.collate <= h.done <= received:
            self.here_seq = h.seq
            return
        self.here_seq = h.seq
        self.nbytes = max(self.nbytes, h.nbytes)  # the first batches only
        waited = max(0.0, h.runq - asked_runq) if asked_runq else 0.0  # for a CPU: CPU work
        fetch_cpu = max(h.cpu - asked_cpu + waited, h.pcpu - asked_pcpu, 0.0)
        out = arith.in_process(asked, received, h.collate, h.done, fetch_cpu, self.pinned)
        self.sink.put(step, out, list(out), sum(out))
        made = getattr(self.sink, "made", None)
        if made is not None:
            made(-1, h.done, h.done - asked)

    def startup(self) -> Startup | None:
        """This pass's worker start-up, from the workers' headers: None where no worker
        started in it (persistent workers after their first pass; no records)."""
        if not self.workers or self.rows is None or not self.live:
            return None
        heads = [self.rows[w, 0].tolist() for w in range(self.workers)]
        new = [h for h in heads if h[H_READY] >= self.began]
        if not new:
            return None
        ready = [h[H_READY] - self.began for h in new]
        unpickle = [h[H_INIT] - h[H_BORN] for h in new if not math.isnan(h[H_BORN])]
        init = [h[H_READY] - h[H_INIT] for h in new]
        return Startup(
            slowest_s=max(ready),
            mean_s=sum(ready) / len(ready),
            unpickle_s=max(0.0, sum(unpickle) / len(unpickle)) if unpickle else None,
            init_s=sum(init) / len(init),
            workers=len(new),
        )
