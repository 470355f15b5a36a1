"""A configuration's processes read through psutil: the training process's and each
worker's CPU seconds and private memory; which processes its iterator's workers are.
Nothing here raises: what cannot be read is None."""

from __future__ import annotations

from typing import Any

from starvecheck.stages.loader.factory.run import Memory


def memory(pid: int | None = None) -> Memory:
    import psutil

    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.Error, OSError):
        return Memory(None, None)
    return Memory(float(getattr(info, "uss", 0)) or None, float(getattr(info, "pss", 0)) or None)


def cpu(pid: int | None = None) -> float | None:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return None
    return float(t.user + t.system)


def worker_pids(it: Any) -> list[int]:
    return [w.pid for w in getattr(it, "_workers", ()) if w.pid is not None]
