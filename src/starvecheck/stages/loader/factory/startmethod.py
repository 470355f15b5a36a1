"""How the pipeline's workers start, and what another start method would cost it
(`loader --factory`, issue 57's start-up): under `forkserver` and `spawn` every worker
receives the whole dataset, pickled, and unpickles it before its first batch; under
`fork` it inherits it. Python 3.14 made `forkserver` the default on Linux, so a
pipeline that is fine under fork can start seconds slower there, every epoch without
persistent workers. The factory reads the count it recommends under the other method
beside the same count (the `start` configuration) and weighs the dataset's pickle.
"""

from __future__ import annotations

import multiprocessing
import pickle
from dataclasses import dataclass
from typing import Any

from starvecheck.core import clocks
from starvecheck.stages.loader.factory.idle import start_method

PICKLE_LIMIT_S = 20.0  # a dataset still pickling after this long: its size is not known
PICKLE_CAP_BYTES = 16 << 30  # nor past this many bytes


@dataclass(frozen=True)
class Pickled:
    """The dataset as a forkserver or spawn worker receives it: its bytes and the
    seconds pickling it took here; None and why where it could not be pickled."""

    nbytes: int | None
    seconds: float
    error: str | None = None


class _Stop(Exception):
    """The pickle ran past its time or size: stopped."""


class _Counter:
    """A file that only counts what is written to it, and stops the pickle past its
    time or size (a dataset's own __reduce__ may take for ever)."""

    def __init__(self, limit_s: float, cap: int) -> None:
        self.n, self.cap = 0, cap
        self.deadline = clocks.monotonic() + limit_s

    def write(self, data: bytes) -> int:
        self.n += len(data)
        if self.n > self.cap or clocks.monotonic() > self.deadline:
            raise _Stop
        return len(data)


def pickled(dataset: Any, limit_s: float = PICKLE_LIMIT_S, cap: int = PICKLE_CAP_BYTES) -> Pickled:
    """The dataset pickled into a counter, as multiprocessing sends it to a worker
    (protocol 5); the user's code runs (its __reduce__, __getstate__): the caller holds
    the user-code guard."""
    started = clocks.perf_counter()
    counter = _Counter(limit_s, cap)
    try:
        pickle.dump(dataset, counter, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[arg-type]
    except _Stop:
        seconds = clocks.perf_counter() - started
        past = "its size limit" if counter.n > cap else f"{limit_s:g} s"
        return Pickled(None, seconds, f"still pickling past {past} ({counter.n:,} bytes so far)")
    except Exception as e:  # what the user's dataset raises: said, never raised
        why = " ".join(f"{type(e).__name__}: {e}".split())
        return Pickled(None, clocks.perf_counter() - started, why[:300])
    return Pickled(counter.n, clocks.perf_counter() - started)


def other_method(context: Any) -> str | None:
    """The start method to read the pipeline under beside its own: forkserver (Python
    3.14's default on Linux) where it forks, fork where it does not (what fork saves);
    None where this platform has no such method."""
    own = start_method(context)
    other = "forkserver" if own == "fork" else "fork"
    return other if other in multiprocessing.get_all_start_methods() else None
