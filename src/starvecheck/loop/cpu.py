"""CPU time read beside the loop's clock: the loop thread's wait for a CPU, and the
DataLoader workers' CPU. Both say whether a wait for data is CPU work or I/O (or
sleep); both read /proc, and read nothing (never raise) where it is not there."""

from __future__ import annotations

import os
from typing import Any

WORKER_SAMPLE = 16  # steps between two readings of the workers' CPU time


class Runqueue:
    """Seconds the calling thread has waited on a run queue (the second field of
    /proc/thread-self/schedstat), read with one pread; always 0 where there is none."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self.read()
        except (OSError, ValueError, IndexError):
            self.close()

    def read(self) -> float:
        if self.fd is None:
            return 0.0
        try:
            return int(os.pread(self.fd, 96, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


class WorkerCpu:
    """The CPU time of a DataLoader iterator's worker processes (its `_workers`, a
    private attribute read defensively), summed; falsy when there are none to read."""

    def __init__(self, it: object) -> None:
        procs = getattr(it, "_workers", None)
        self.pids = [p.pid for p in procs or () if getattr(p, "pid", None)]
        self.procs: list[Any] | None = None

    def __bool__(self) -> bool:
        return bool(self.pids)

    def sample(
        self, steps: int, into: list[tuple[int, float]], runq: list[tuple[int, float]] | None = None
    ) -> None:
        """Append (steps, the workers' CPU seconds) to `into` and, where their schedstat
        can be read, (steps, their seconds waiting for a CPU) to `runq`."""
        try:
            import psutil

            if self.procs is None:
                self.procs = [psutil.Process(pid) for pid in self.pids]
            total = 0.0
            for p in self.procs:
                t = p.cpu_times()
                total += t.user + t.system
        except Exception:  # a worker gone (the pass ended, killed): no reading
            self.pids = []
            return
        into.append((steps, total))
        if runq is not None:
            from starvecheck.probe.load import runq_seconds

            waited = [runq_seconds(pid) for pid in self.pids]
            if all(w is not None for w in waited):
                runq.append((steps, sum(w for w in waited if w is not None)))
