"""A DataLoader worker that has read nothing of the user's dataset, measured: the
private memory (USS) a worker holds before any sample, under the same interpreter,
imports and start method as the pipeline's workers. A worker of the user's pipeline
that holds far more from its first batch on has copied what it touched (forked pages
of Python objects) or built state of its own; advice/costs.py weighs it.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.signals import importing
from starvecheck.stages.dataloader.workers import stop_workers, worker_init

SETTLE_S = 0.2  # after its one batch, before its memory is read


class _One:
    """A one-item map-style dataset: the worker fetches index 0 and then waits."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        return i


def start_method(context: Any) -> str:
    """How the pipeline's workers start: its multiprocessing_context, else the default."""
    if context is None:
        return str(multiprocessing.get_start_method(allow_none=False))
    if isinstance(context, str):
        return context
    return str(getattr(context, "_name", None) or context.get_start_method())


def idle_worker_uss(context: Any) -> int | None:
    """One worker (persistent, so it outlives its one batch) over a one-item dataset;
    its USS once it has delivered. None where it cannot be read."""
    import psutil

    with importing("torch"):
        from torch.utils.data import DataLoader

    loader = DataLoader(
        _One(),  # type: ignore[arg-type]
        batch_size=None,
        num_workers=1,
        persistent_workers=True,
        multiprocessing_context=context,
        # starvecheck's worker set-up: it dies with this process.
        worker_init_fn=functools.partial(worker_init, parent=os.getpid()),
    )
    it: Any = None
    try:
        it = iter(loader)
        next(it)
        clocks.sleep(SETTLE_S)
        pids = [w.pid for w in getattr(it, "_workers", ()) if w.pid is not None]
        if not pids:
            return None
        return int(psutil.Process(pids[0]).memory_full_info().uss) or None
    except (psutil.Error, OSError, RuntimeError, StopIteration):
        return None
    finally:
        if it is not None:
            stop_workers(it)
