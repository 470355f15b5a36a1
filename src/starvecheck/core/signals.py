"""Signals as exceptions, process-wide: SIGTERM and SIGHUP raise like Ctrl-C while a
run has something to clean up, so every `finally` runs; held while a critical step
(making or removing a directory) must not be cut short, and while a library whose
import runs C++ code is imported (`importing`); a signal swallowed where Python drops
exceptions (an at-fork callback, a `__del__`) raised again at the next `check_signals`.
scratch/directory.py, the stages and the command line all use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised like KeyboardInterrupt so cleanup code runs.

    A BaseException, as KeyboardInterrupt is, so `except Exception` does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


# Every signal caught inside `signals_raise` in this process, never cleared: a signal
# can surface as another error (torch reports a worker that the same signal stopped as
# a RuntimeError, which can replace the exception unwinding); `received` lets the one
# place that decides exit statuses report the signal instead.
_received: list[int] = []


def received() -> int | None:
    """The first signal caught while measuring, if any."""
    return _received[0] if _received else None


def forget_received() -> None:
    """A new run (tests run several in one process)."""
    _received.clear()


# While inside `signals_raise`: a child forked then (a DataLoader worker) must not run
# our handler, which would raise in the child; it ignores SIGTERM and SIGHUP from the
# fork on (workers.worker_init says why) and takes Ctrl-C as torch expects.
_raising = False


def _child_after_fork() -> None:
    if _raising:
        with contextlib.suppress(ValueError):  # not the main thread: nothing to undo
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.default_int_handler)


os.register_at_fork(after_in_child=_child_after_fork)

# The signal caught inside `signals_raise`, kept until the block is left. Python drops
# an exception raised where it cannot propagate (an at-fork callback, such as the one
# logging registers, which runs as each DataLoader worker is forked; __del__; weakref
# callbacks) and prints "Exception ignored"; `check_signals` raises it again.
_caught: list[int] = []


def _destroying_loader_iterator(info: sys.UnraisableHookArgs) -> bool:
    name = getattr(info.object, "__qualname__", "")
    return name.endswith("DataLoaderIter.__del__")


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def check_signals() -> None:
    """Raise the signal caught earlier, if its exception was swallowed. Measuring loops
    call this between units of work; code that is already unwinding never reaches it."""
    if _caught:
        raise _exception(_caught[0])


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While inside: SIGINT raises KeyboardInterrupt and SIGTERM/SIGHUP raise
    `Terminated`, so `finally` blocks run. From the first signal on, further ones are
    ignored until the block is left: a second Ctrl-C while the first unwinds must not
    cut the cleanup short. Signals ignored on entry (SIGHUP under nohup, SIGINT in a
    background job) stay ignored. Handlers are restored on the way out."""
    global _raising
    if not in_main_thread() or _raising:  # signal.signal only works in the main thread;
        yield  # inside another such block (the command line's), its handlers already raise
        return

    def ignore(signum: int, frame: object) -> None:
        pass

    def handler(signum: int, frame: object) -> None:
        for s in old:
            signal.signal(s, ignore)
        _caught.append(signum)
        _received.append(signum)
        raise _exception(signum)

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        # A swallowed interrupt is not news: check_signals raises it again. Nor is a
        # DataLoader iterator the interrupt cut short failing in __del__ (after_interrupt
        # below), which may be freed before this block is left.
        if _caught and (
            isinstance(info.exc_value, KeyboardInterrupt | Terminated)
            or _destroying_loader_iterator(info)
        ):
            return
        previous_hook(info)

    def after_interrupt(info: sys.UnraisableHookArgs) -> None:
        # An interrupt that cut a DataLoader iterator's __init__ short leaves a
        # half-built iterator; its __del__ fails (a missing attribute) when the
        # traceback holding it is freed, after this block. Not news either.
        if _destroying_loader_iterator(info):
            return
        previous_hook(info)

    old = {s: signal.getsignal(s) for s in SIGNALS}
    old = {s: h for s, h in old.items() if h is not signal.SIG_IGN}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = unraisable
    for s in old:
        signal.signal(s, handler)
    _raising = True
    try:
        yield
    finally:
        _raising = False
        for s, h in old.items():
            signal.signal(s, h)
        sys.unraisablehook = after_interrupt if _caught else previous_hook
        _caught.clear()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP until the block ends, then deliver the first one that
    is not ignored; those ignored at entry stay ignored.

    Python-level handlers, not pthread_sigmask: a signal caught by any thread runs
    its Python handler in the main thread, so masking one thread would not help.
    """
    if not in_main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)

    # A handler set outside Python (getsignal says None) cannot be put back: left alone.
    # An ignored signal stays ignored (SIGINT in a background job, SIGHUP under nohup):
    # held, it would be raised first and ignored, and a SIGTERM held after it lost.
    old = {s: h for s in SIGNALS if (h := signal.getsignal(s)) not in (None, signal.SIG_IGN)}
    for s in old:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        # The first held signal that something still takes (a handler may have been set
        # to SIG_IGN inside the block, as `signals_raise`'s first signal does).
        taken = [s for s in pending if signal.getsignal(s) is not signal.SIG_IGN]
        if taken:
            signal.raise_signal(taken[0])


@contextlib.contextmanager
def importing(library: str) -> Iterator[None]:
    """Around the import of a library whose import runs C++ code: torch, and what imports
    it (transformers, streaming), matplotlib, pyarrow; `library` names the one imported.
    First what would end the process as it loads (a removed working directory, too
    small an address-space limit) is one line (core/surroundings.check). Signals are
    held until the import is done, then the first is raised at the next line of Python.

    Why: while torch initialises its C++ extension, pybind11 calls back into Python
    (importlib's locks); a handler that raises there (ours, in `signals_raise`) throws a
    C++ exception through code that cannot pass it on, and the process aborts (exit
    134, 85 lines from pybind11). `torch._C._c10d_init` did, for one SIGTERM to the
    process group at start-up in a dozen on one machine, in a few hundred on another
    (tests/test_signals_import.py hits it every time). Held, the signal waits the rest
    of the import (a second or so), never longer.
    """
    from starvecheck.core import surroundings

    surroundings.check(library)
    with signals_held():
        yield
