"""The clocks starvecheck bounds its windows, budgets and time limits by, bound when
starvecheck is imported: out of reach of the user's code that runs in its process.

`loader --factory` runs the user's FUNC, Dataset and collate_fn in starvecheck's own
process, and `watch` runs inside the user's training loop. Code there may replace
time.perf_counter, time.monotonic, time.time or time.sleep (freezegun does: it also
rewrites every module attribute that holds the real function): a frozen clock would
make every window endless, and a run that is bounded by time run for ever. So the real
functions are taken from the time module here, once, and kept in a holder that such
rewriting does not walk (a class's attributes, not a module's); starvecheck's own code
reads time only through this module (tests/test_clocks.py checks the source).
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from types import SimpleNamespace

_REAL = SimpleNamespace(
    perf_counter=_time.perf_counter,
    perf_counter_ns=_time.perf_counter_ns,
    monotonic=_time.monotonic,
    time=_time.time,
    sleep=_time.sleep,
    process_time=_time.process_time,
    thread_time=_time.thread_time,
    clock_gettime=_time.clock_gettime,
)


def steps() -> tuple[Callable[[], float], Callable[[], float], Callable[[], float]]:
    """(thread_time, process_time, perf_counter): the real functions themselves, for a
    loop that reads them every step (watch) and binds them to its locals, never to a
    module's attributes (where a frozen clock's rewriting would find them)."""
    return _REAL.thread_time, _REAL.process_time, _REAL.perf_counter


def perf_counter() -> float:
    return float(_REAL.perf_counter())


def perf_counter_ns() -> int:
    return int(_REAL.perf_counter_ns())


def monotonic() -> float:
    return float(_REAL.monotonic())


def time() -> float:
    """Seconds since the epoch (the wall clock: for stamps, never for a duration)."""
    return float(_REAL.time())


def sleep(seconds: float) -> None:
    _REAL.sleep(seconds)


def process_time() -> float:
    return float(_REAL.process_time())


def thread_time() -> float:
    return float(_REAL.thread_time())


def clock_gettime(clock_id: int) -> float:
    return float(_REAL.clock_gettime(clock_id))
