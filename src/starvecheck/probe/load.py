"""What else the machine is doing while starvecheck measures: the CPU other processes
use, time stolen by the hypervisor, the cgroup's throttling, and how long our own
processes waited for a CPU while runnable (their run-queue time). A figure measured
while other work holds the cores says less about the pipeline than about the machine;
these readings say by how much.

Sources, each read where it is there and skipped (None) where it is not:
- /proc/stat, first line: the whole machine's CPU time by kind (USER_HZ ticks);
- /proc/PID/stat fields 14 and 15: a process's user and system time (ticks), all its
  threads together;
- /proc/PID/task/TID/schedstat: each thread's time on a CPU and waiting on a run
  queue (nanoseconds; present with CONFIG_SCHED_INFO, which common kernels have),
  summed over the process's threads;
- the cgroup's cpu.stat: throttled time where a CPU quota is enforced.
Parsers are pure functions of text; `sample` never raises.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from starvecheck.probe import process
from starvecheck.probe.process import parse_stat
from starvecheck.probe.sysroot import SysRoot

TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


@dataclass(frozen=True)
class CpuTimes:
    """/proc/stat's `cpu` line in seconds: busy (user, nice, system, irq, softirq),
    idle (idle, iowait), stolen by the hypervisor."""

    busy: float
    idle: float
    steal: float

    @property
    def total(self) -> float:
        return self.busy + self.idle + self.steal


def parse_proc_stat(text: str, cpus: Collection[int] | None = None) -> CpuTimes | None:
    """The `cpu` line, or with `cpus` the sum of those CPUs' own lines (`cpuN`): where
    a process may run on some CPUs only (affinity, a cpuset), what others take of those
    is what it competes with. None where the line(s) cannot be read (a CPU of `cpus`
    offline or missing included)."""
    want = None if cpus is None else {f"cpu{n}" for n in cpus}
    busy = idle = steal = 0.0
    seen = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts or (parts[0] != "cpu" if want is None else parts[0] not in want):
            continue
        try:
            v = [int(x) for x in parts[1:]]
        except ValueError:
            return None
        if len(v) < 4:
            return None
        v += [0] * (8 - len(v))
        user, nice, system, idle_, iowait, irq, softirq, stolen = v[:8]
        busy += (user + nice + system + irq + softirq) * TICK_S
        idle += (idle_ + iowait) * TICK_S
        steal += stolen * TICK_S
        seen += 1
        if want is None:
            break
    if seen == 0 or (want is not None and seen != len(want)):
        return None
    return CpuTimes(busy, idle, steal)


def parse_pid_stat(text: str) -> float | None:
    """A process's user + system CPU seconds, from /proc/PID/stat (probe/process.py's
    parser, the one every reader of that file uses)."""
    parsed = parse_stat(text)
    return parsed.cpu_s if parsed is not None else None


def parse_schedstat(text: str) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable on a run queue) from /proc/PID/schedstat."""
    parts = text.split()
    try:
        return int(parts[0]) / 1e9, int(parts[1]) / 1e9
    except (IndexError, ValueError):
        return None


def parse_loadavg(text: str) -> float | None:
    """The 1-minute load average, the first field of /proc/loadavg."""
    try:
        value = float(text.split()[0])
    except (IndexError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def load_average(root: SysRoot | None = None) -> float | None:
    """The machine's 1-minute load average (runnable and uninterruptible tasks), or
    None where /proc/loadavg cannot be read."""
    text = _read(root or SysRoot.from_environ({}), "/proc/loadavg")
    return parse_loadavg(text) if text else None


def parse_throttled(text: str) -> float | None:
    """Throttled seconds from a cgroup's cpu.stat (v2 `throttled_usec`, v1
    `throttled_time` in ns); None where it counts none."""
    for line in text.splitlines():
        key, _, number = line.partition(" ")
        try:
            if key == "throttled_usec":
                return int(number) / 1e6
            if key == "throttled_time":
                return int(number) / 1e9
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class Sample:
    """One reading: the machine's CPU times, our processes' CPU and run-queue seconds
    (summed over the pids asked for), the cgroup's throttled seconds."""

    machine: CpuTimes | None
    ours_cpu: float | None
    ours_runq: float | None
    throttled: float | None


def _read(root: SysRoot, path: str) -> str | None:
    text = root.read(path)
    return text.value if text.known else None


def machine_times(
    root: SysRoot | None = None, cpus: Collection[int] | None = None
) -> CpuTimes | None:
    """The machine's CPU times now (/proc/stat; with `cpus`, those CPUs' alone), or
    None where they cannot be read."""
    text = _read(root or SysRoot.from_environ({}), "/proc/stat")
    return parse_proc_stat(text, cpus) if text else None


def allowed_cpus(pid: int = 0) -> frozenset[int] | None:
    """The CPUs `pid` (0: this process) may run on, where that is fewer than the
    machine's online CPUs; None where it may run on all of them or it cannot be read."""
    try:
        allowed = frozenset(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None
    return allowed if allowed and len(allowed) < (os.cpu_count() or 0) else None


def cpus_read(cpus: Collection[int] | None) -> int:
    """How many CPUs a reading of `cpus` (allowed_cpus'; None: the machine's) is of:
    0 where the machine's count is unknown."""
    return len(cpus) if cpus else (os.cpu_count() or 0)


def at_most_cpus(value: float, cpus: Collection[int] | None) -> float:
    """`value` (CPUs busy over a second) bounded by the CPUs read: a stall between the
    clock and /proc on a loaded machine stretches the CPU time counted past the
    seconds timed."""
    n = cpus_read(cpus)
    return min(n, value) if n else value


def ours_cpu() -> float | None:
    """CPU seconds of this process and every process it started: its own threads, the
    children it has reaped (cutime, cstime), and those still alive with the children
    each of them reaped (a forkserver's workers); None where they
    cannot be read. Over an interval, with the machine's busy time, it tells what the
    rest of the machine used."""
    try:
        import psutil

        me = psutil.Process()
        t = me.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in me.children(recursive=True):
            try:
                c = child.cpu_times()
            except psutil.Error:
                continue  # gone in between: reaped, its time in children_*
            # and the children it reaped: a forkserver's workers are its children, not
            # ours, and their time moves into its children_* when they exit
            total += c.user + c.system + c.children_user + c.children_system
        return total
    except Exception:
        return None


def runq_seconds(pid: int, root: SysRoot | None = None) -> float | None:
    """Seconds every thread of `pid` has waited on a run queue, or None."""
    return _runq(root or SysRoot.from_environ({}), pid)


def on_cpu_seconds(pid: int, root: SysRoot | None = None) -> float | None:
    """Seconds every thread of `pid` has run on a CPU (schedstat, in ns: finer than
    /proc/PID/stat's clock ticks), or None."""
    return _threads(root or SysRoot.from_environ({}), pid, 0)


def _runq(root: SysRoot, pid: int) -> float | None:
    """Run-queue seconds of every thread of `pid` (torch's intra-op threads too)."""
    return _threads(root, pid, 1)


def _threads(root: SysRoot, pid: int, field: int) -> float | None:
    """Field `field` of parse_schedstat (0: on a CPU, 1: on a run queue), summed over
    every thread of `pid`; None where no thread's could be read."""
    try:
        tids = os.listdir(root.path(f"/proc/{pid}/task"))
    except OSError:
        tids = []
    total, seen = 0.0, False
    paths = [f"/proc/{pid}/task/{t}/schedstat" for t in tids] or [f"/proc/{pid}/schedstat"]
    for path in paths:
        text = _read(root, path)
        s = parse_schedstat(text) if text else None
        if s is not None:
            total += s[field]
            seen = True
    return total if seen else None


def sample(
    pids: Iterable[int],
    cpu_stat: str | None = None,
    root: SysRoot | None = None,
    runq: bool = True,
    cpus: Collection[int] | None = None,
) -> Sample:
    """The machine now, and `pids` (processes that may have exited: skipped).
    `cpu_stat`: the cgroup's cpu.stat path where a quota is enforced (probe/cgroup.py
    finds it), else None. `runq=False`: the threads' run-queue time is not read (one
    file a thread: a process with hundreds of threads costs a millisecond). `cpus`: the
    machine read on those CPUs alone (`allowed_cpus`)."""
    root = root or SysRoot.from_environ({})
    text = _read(root, "/proc/stat")
    machine = parse_proc_stat(text, cpus) if text else None
    cpu = queued = 0.0
    seen_cpu = seen_runq = False
    for pid in pids:
        read = process.stat(root, pid)
        if read is not None:
            cpu += read.cpu_s
            seen_cpu = True
        waited = _runq(root, pid) if runq else None
        if waited is not None:
            queued += waited
            seen_runq = True
    throttled = None
    if cpu_stat:
        text = _read(root, cpu_stat)
        throttled = parse_throttled(text) if text else None
    return Sample(machine, cpu if seen_cpu else None, queued if seen_runq else None, throttled)


@dataclass(frozen=True)
class Load:
    """What the machine did between two samples: CPUs other processes kept busy, the
    share of the CPU time stolen, our processes' run-queue wait per second of wall
    time, seconds throttled; None where it could not be read."""

    seconds: float
    others_cpus: float | None
    steal_share: float | None
    ours_runq_per_s: float | None
    throttled_s: float | None


def between(a: Sample, b: Sample, seconds: float) -> Load:
    """The load over `seconds` between samples `a` and `b` (the same pids in both:
    a process that started or ended in between makes its part unreliable, and callers
    sample the same set)."""
    others = steal = runq = throttled = None
    if a.machine and b.machine and seconds > 0:
        busy = b.machine.busy - a.machine.busy
        total = b.machine.total - a.machine.total
        if a.ours_cpu is not None and b.ours_cpu is not None:
            others = max(0.0, (busy - (b.ours_cpu - a.ours_cpu)) / seconds)
        if total > 0:
            steal = max(0.0, (b.machine.steal - a.machine.steal) / total)
    if a.ours_runq is not None and b.ours_runq is not None and seconds > 0:
        runq = max(0.0, (b.ours_runq - a.ours_runq) / seconds)
    if a.throttled is not None and b.throttled is not None:
        throttled = max(0.0, b.throttled - a.throttled)
    return Load(seconds, others, steal, runq, throttled)
