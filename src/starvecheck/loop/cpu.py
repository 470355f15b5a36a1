"""CPU time read beside the loop's clock: the loop thread's wait for a CPU, and the
DataLoader workers' CPU. Both say whether a wait for data is CPU work or I/O (or
sleep); both read /proc, and read nothing (never raise) where it is not there. And
about once a second the machine: the CPUs other processes use beside the training
process and its workers, and the training process's own (the worker model's bound)."""

from __future__ import annotations

import os
from typing import Any

from starvecheck.core import clocks

WORKER_SAMPLE = 16  # steps between two readings of the workers' CPU time
# Seconds between two readings of the machine's CPU: never per step (a /proc/stat read
# and one per worker, some tens of microseconds, once a second: under 0.01% of it).
MACHINE_EACH_S = 1.0


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


class MachineCpu:
    """The CPUs other processes kept busy, and the training process's own (all its
    threads), each second or so: /proc/stat's busy time less this process's and its
    workers' (probe/load.sample, between). `due()` is one clock read; a reading that
    cannot be made (no /proc, a worker gone) is skipped, and the next starts afresh."""

    def __init__(self, workers: list[int] | None = None) -> None:
        from starvecheck.probe.load import allowed_cpus

        self.pids = [os.getpid(), *(workers or [])]
        self.cpus = allowed_cpus()  # others read on the CPUs this process may use
        self.next_at = clocks.perf_counter() + MACHINE_EACH_S
        self.last: tuple[float, Any, float] | None = None
        self.read(None, None)

    def due(self) -> bool:
        return clocks.perf_counter() >= self.next_at

    def read(self, others: list[float] | None, process: list[float] | None) -> None:
        """Append the seconds since the last reading: others' CPUs to `others`, this
        process's to `process`."""
        from starvecheck.probe.load import at_most_cpus, between, sample

        now = clocks.perf_counter()
        self.next_at = now + MACHINE_EACH_S
        try:
            s, mine = sample(self.pids, runq=False, cpus=self.cpus), clocks.process_time()
        except Exception:
            self.last = None
            return
        if s.machine is None or s.ours_cpu is None:
            self.last = None
            return
        if self.last is not None and others is not None and process is not None:
            at, before, mine0 = self.last
            load = between(before, s, now - at)
            if load.others_cpus is not None and s.ours_cpu >= before.ours_cpu:
                own = max(0.0, mine - mine0) / (now - at)
                others.append(round(at_most_cpus(load.others_cpus, self.cpus), 3))
                process.append(round(at_most_cpus(own, self.cpus), 3))
        self.last = (now, s, mine)


def machine_facts() -> dict[str, float | None]:
    """The CPUs others' use is read on (those this process may run on: all the
    machine's where nothing restricts it) and the 1-minute load average."""
    from starvecheck.probe.load import allowed_cpus, cpus_read, load_average

    cpus = cpus_read(allowed_cpus())
    return {"machine_cpus": float(cpus) or None, "load_average": load_average()}
