"""Batches from a torch DataLoader, each within a time limit.

A DataLoader that delivers nothing (a worker stuck in I/O, a collate that deadlocks, a
`__getitem__` that never returns) would keep a run waiting for ever. Every stage that
iterates a DataLoader does it through `Batches`: no batch within the limit ends the
run in one line (`BatchTimeout`, exit 2) and the workers are stopped on the way out,
on every other way out too.

How the wait is bounded: a real-time timer (setitimer ITIMER_REAL, SIGALRM) armed
around each next() in the main thread, whatever num_workers is. With num_workers=0
the main process loads the batch itself, so DataLoader(timeout=) would not apply; with
workers the main thread waits on a queue, which the signal interrupts as well. The
handler raises `_Expired`, a BaseException so that `except Exception` in torch
(`_try_get_data`) or in a dataset does not swallow it; where it is lost all the same
(raised inside a __del__ or a callback, where Python drops exceptions) the timer fires
again every `RETRY_S` until it lands. SIGINT, SIGTERM and SIGHUP (scratch/directory.py's) are
not touched; the SIGALRM handler and unraisable hook in place before are put back on
the way out, and a timer someone else has running is left alone (no limit then).

The first batch's limit counts from iter(loader): worker start-up is part of it. With
workers, iter() only forks them and is not interrupted, neither by the timer nor by
Ctrl-C or SIGTERM, which are held until it returns (a fork cut short leaves a
half-built iterator whose workers nobody could stop); the time it took is deducted.

Not covered: outside the main thread, where handlers cannot be set (a DataLoader built
with its own `timeout=` still ends in the same line), and a wait the kernel does not
interrupt (a read in uninterruptible sleep on a hung hard-mounted NFS server, a C
extension that retries on EINTR without checking for signals).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.signals import signals_held
from starvecheck.core.status import BatchTimeout
from starvecheck.stages.dataloader.workers import HURRY_GRACE_S, stop_workers
from starvecheck.stages.options import BATCH_TIMEOUT_S

# The limit `loader`, `starve`, `profile` and `doctor` apply (--batch-timeout; why this
# one: stages/options.py, where it is declared).
DEFAULT_TIMEOUT_S = BATCH_TIMEOUT_S
# After the timer first fires, it fires again this often until its exception lands.
RETRY_S = 1.0
# What a user can do about a limit that was too short.
HINT = "raise --batch-timeout if a batch really takes this long"


class _Expired(BaseException):
    """SIGALRM: the batch asked for is late. Turned into BatchTimeout by `Batches`."""


# The Batches whose SIGALRM handler is installed now, innermost last.
_installed: list[Batches] = []


def _child_after_fork() -> None:
    """A worker forked while a handler is installed gets the handler that was there
    before: the timer is the parent's alone (fork does not inherit timers)."""
    if _installed:
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGALRM, _installed[0]._previous_handler())
        sys.unraisablehook = _installed[0]._saved_hook
        _installed.clear()


os.register_at_fork(after_in_child=_child_after_fork)


def describe_limit(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 100 else f"{seconds:.3g} s"


class Batches:
    """Iterate `loader` with each batch due within `limit_s` seconds (0: no limit);
    use as a context manager, which starts the iterator and stops its workers on the
    way out (killing them after a timeout, as they are stuck). `stage` and `what` name
    the loader in the error: "loader: no batch from the DataLoader (shard,
    num_workers=2) in 120 s: ..."."""

    def __init__(
        self,
        loader: Any,
        limit_s: float,
        stage: str,
        what: str,
        hint: str = HINT,
        keep: bool = False,
        workers: int | None = None,
    ) -> None:
        self.loader = loader
        # keep: a persistent-workers DataLoader whose workers serve the next epoch; they
        # are stopped here only on the way out of an error (the caller stops them last).
        self.keep = keep
        self.limit_s = limit_s
        self.stage = stage
        self.what = what
        self.hint = hint
        # The DataLoader's; where `loader` is an object around one, the caller says.
        self.workers = int(getattr(loader, "num_workers", 0) or 0) if workers is None else workers
        self._it: Any = None
        self._first = True
        self._started = 0.0
        self._watching = False
        self._armed = False
        self._expired = False
        self._hurried = False
        self._saved_handler: Any = None
        self._saved_hook: Any = None

    # --- the context -----------------------------------------------------------------

    def __enter__(self) -> Batches:
        self._started = clocks.monotonic()
        self._watching = self.limit_s > 0 and self._install()
        try:
            if self._watching and not self.workers:
                self._it = self._watched(iter, self.loader, self.limit_s)
            elif not self.workers:
                self._it = iter(self.loader)
            else:
                # Ctrl-C or SIGTERM held while the workers start: one raised half-way
                # through would leave a half-built iterator whose started workers,
                # which ignore SIGTERM, nobody stops, and multiprocessing's exit would
                # wait on them for ever. Delivered once the iterator is whole.
                with signals_held():
                    self._it = iter(self.loader)
        except BaseException:
            if self._it is not None:  # the held signal, delivered: stop what started
                stop_workers(self._it)
                self._it = None
            self._uninstall()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._it is not None and not (self.keep and exc[0] is None):
                # A signal (Ctrl-C, SIGTERM) ends the run: its workers get the short
                # grace of stuck ones, not torch's 5 s each, which a worker still in a slow
                # worker_init_fn would use up before it is killed all the same.
                signalled = exc[0] is not None and not issubclass(exc[0], Exception)  # type: ignore[arg-type]
                stuck = self._expired or signalled
                try:
                    if self._hurried and not stuck:
                        stop_workers(self._it, stuck=True, grace_s=HURRY_GRACE_S)
                    else:
                        stop_workers(self._it, stuck=stuck)
                except BaseException:
                    # A signal cut the shutdown short (scratch/directory.py ignores any after the
                    # first): kill what is left, or multiprocessing's exit would wait on
                    # a worker that ignores SIGTERM.
                    stop_workers(self._it, stuck=True)
                    raise
        finally:
            self._it = None
            self._uninstall()

    def hurry(self) -> None:
        """The batches in flight are not wanted: the workers, stopped on the way out,
        get HURRY_GRACE_S to leave, and any still making a batch is killed, instead of
        the shutdown waiting for the rest of that batch (seconds a batch, read by when
        they were made: loader --factory's made.py)."""
        self._hurried = True

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Any:
        first, self._first = self._first, False
        try:
            if not self._watching:
                return next(self._it)
            limit = self.limit_s
            if first:  # iter() forked the workers: part of the first batch's time
                limit = max(0.01, self.limit_s - (clocks.monotonic() - self._started))
            return self._watched(next, self._it, limit, first)
        except RuntimeError as e:
            # The DataLoader's own timeout= (a user's loader, or outside the main
            # thread): the same line.
            if not str(e).startswith("DataLoader timed out after"):
                raise
            self._expired = True
            limit = float(getattr(self.loader, "timeout", 0) or 0)
            raise BatchTimeout(self._message(first, limit)) from None

    # --- the watchdog ----------------------------------------------------------------

    def _watched(self, call: Any, arg: Any, limit: float, first: bool = True) -> Any:
        """call(arg) with the timer armed for `limit` seconds; `_Expired` becomes
        BatchTimeout."""
        try:
            self._armed = True
            try:
                signal.setitimer(signal.ITIMER_REAL, limit, RETRY_S)
                return call(arg)
            finally:
                self._quiet()
        except _Expired:
            self._quiet()
            self._expired = True
            raise BatchTimeout(self._message(first, self.limit_s)) from None

    def _quiet(self) -> None:
        self._armed = False  # first: a signal already on its way is a no-op from here
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _ring(self, signum: int, frame: object) -> None:
        if self._armed:
            raise _Expired()

    def _install(self) -> bool:
        """Our SIGALRM handler for the context; False where none can be set (not the
        main thread) or someone else's timer is running."""
        try:
            if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
                return False
            self._saved_handler = signal.signal(signal.SIGALRM, self._ring)
        except ValueError:  # not the main thread
            return False
        self._saved_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        _installed.append(self)
        return True

    def _uninstall(self) -> None:
        if not self._watching:
            return
        self._watching = False
        self._quiet()
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGALRM, self._previous_handler())
        sys.unraisablehook = self._saved_hook
        if self in _installed:
            _installed.remove(self)

    def _previous_handler(self) -> Any:
        # None: the handler before was not set from Python (the default, as a rule).
        return signal.SIG_DFL if self._saved_handler is None else self._saved_handler

    def _unraisable(self, info: Any) -> None:
        # `_Expired` raised where Python cannot propagate it: the timer fires again.
        if not isinstance(info.exc_value, _Expired):
            self._saved_hook(info)

    # --- the line ----------------------------------------------------------------------

    def _message(self, first: bool, limit: float) -> str:
        which = "first batch" if first else "batch"
        where = f"({self.what}, num_workers={self.workers})"
        if self.workers:
            started = " (worker start-up included)" if first else ""
            cause = "a worker is stuck"
        else:
            started = ""
            cause = "the main process is stuck loading it"
        return (
            f"{self.stage}: no {which} from the DataLoader {where} in "
            f"{describe_limit(limit)}{started}: {cause} (in I/O, a lock, or a collate that "
            f"never returns); {self.hint}"
        )
