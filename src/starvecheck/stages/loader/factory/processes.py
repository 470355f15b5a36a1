"""The processes of one configuration's reading (configuration.py), read after its
windows: the CPU of the main process and of every worker (psutil) and their seconds
runnable but waiting for a CPU (run queue, /proc/PID/task/*/schedstat); the workers'
seconds alive, of which what is neither CPU nor run queue is blocked (I/O, sleep); the
CPU other processes used (/proc/stat less ours); and each process's USS and PSS after
the warm-up and at the end (their growth is what copy-on-read costs). Workers exit at
the end of an epoch: their last reading stands."""

from __future__ import annotations

import os
from collections.abc import Callable

from starvecheck.probe.load import CpuTimes, machine_times, ours_cpu, runq_seconds
from starvecheck.stages.loader.factory import procs
from starvecheck.stages.loader.factory.run import Memory, Run


class Processes:
    """Each process's first and latest reading, by pid (None: this process)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.cpu0: dict[int | None, float] = {}  # pid (None: this process) -> at the start
        self.cpu1: dict[int | None, float] = {}  # -> latest
        self.runq0: dict[int | None, float] = {}
        self.runq1: dict[int | None, float] = {}
        self.seen0: dict[int | None, float] = {}  # when each was first and last read
        self.seen1: dict[int | None, float] = {}
        self.machine0: CpuTimes | None = None  # the machine's CPU times, windows' start
        self.ours0: float | None = None  # this process and its children, then
        self.mem0: dict[int | None, Memory] = {}
        self.mem1: dict[int | None, Memory] = {}

    def sample(self, pids: list[int | None], first: bool, memory: bool = True) -> None:
        now = self.clock()
        if self.machine0 is None:
            self.machine0, self.ours0 = machine_times(), ours_cpu()
        for pid in pids:
            cpu = procs.cpu(pid)
            if cpu is not None:
                if first or pid not in self.cpu0:
                    self.cpu0.setdefault(pid, cpu)
                    self.seen0.setdefault(pid, now)
                self.cpu1[pid] = cpu
                self.seen1[pid] = now
            runq = runq_seconds(os.getpid() if pid is None else pid)
            if runq is not None:
                self.runq0.setdefault(pid, runq)
                self.runq1[pid] = runq
            mem = procs.memory(pid) if memory else Memory(None, None)
            if mem.uss is not None:
                self.mem0.setdefault(pid, mem)
                self.mem1[pid] = mem

    def memory(self, pids: list[int | None]) -> None:
        for pid in pids:
            mem = procs.memory(pid)
            if mem.uss is not None:
                self.mem0.setdefault(pid, mem)
                self.mem1[pid] = mem

    def figures(self, run: Run, started_windows: float) -> None:
        """Their figures into `run`: CPU (the digest's, ours, out of the main
        process's), run queue, seconds alive, the others' CPUs over the windows (from
        `started_windows`), memory at the start and the end."""
        if None in self.cpu0 and None in self.cpu1:  # the digest's CPU is ours
            run.main_cpu_s = max(0.0, self.cpu1[None] - self.cpu0[None] - run.digest_s)
        workers = [p for p in self.cpu1 if p is not None and p in self.cpu0]
        run.worker_cpu_s = (
            sum(self.cpu1[p] - self.cpu0[p] for p in workers)
            if workers
            else (0.0 if not run.config.workers else None)
        )
        if None in self.runq0:
            run.main_runq_s = self.runq1[None] - self.runq0[None]
        waited = [p for p in workers if p in self.runq0]
        if waited:
            run.worker_runq_s = sum(self.runq1[p] - self.runq0[p] for p in waited)
        if workers:
            run.worker_alive_s = sum(self.seen1[p] - self.seen0[p] for p in workers)
        if None in self.seen0:
            run.main_span_s = self.seen1[None] - self.seen0[None]
        end, ours = machine_times(), ours_cpu()
        mine = None if ours is None or self.ours0 is None else ours - self.ours0
        known = self.machine0 is not None and end is not None and started_windows
        if known and mine is not None and mine >= 0:  # < 0: one of ours gone uncounted
            span = max(self.clock() - started_windows, 1e-9)
            busy = end.busy - self.machine0.busy
            run.others_cpus = max(0.0, (busy - mine) / span)
        if None in self.mem0:
            run.main_memory = (self.mem0[None], self.mem1[None])
        run.worker_memory = [(self.mem0[p], self.mem1[p]) for p in self.mem0 if p is not None]
