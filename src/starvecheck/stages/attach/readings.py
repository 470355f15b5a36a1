"""What /proc and the cgroup say of a running job over the seconds `attach` samples
it: each process's CPU (user+system), its threads' time runnable but waiting for a CPU,
its memory (USS at the start and the end, from smaps_rollup) and the bytes it read;
the machine's CPU; the cgroup's throttling; /dev/shm in use. Nothing is written
anywhere; a process that exits meanwhile keeps its last reading.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from starvecheck.core import clocks
from starvecheck.probe import process
from starvecheck.probe.cgroup import cpu_stat_dir, parse_flat_keyed
from starvecheck.probe.life import Life, read_life
from starvecheck.probe.load import (
    allowed_cpus,
    at_most_cpus,
    cpus_read,
    load_average,
    machine_times,
    ours_cpu,
    parse_throttled,
    runq_seconds,
)
from starvecheck.probe.sysroot import SysRoot


def _root() -> SysRoot:
    return SysRoot.from_environ()


@dataclass
class Snapshot:
    at: float
    cpu_s: float | None = None
    thread_cpu_s: float | None = None  # the process's main thread alone
    runq_s: float | None = None
    uss: int | None = None
    read_bytes: int | None = None


def snapshot(pid: int, uss: bool = False, runq: bool = True) -> Snapshot | None:
    """One reading of `pid`. `runq`: its threads' run-queue time too, one schedstat
    file a thread: only workers' is judged, and a rank with 3,000 threads read so
    each second took attach's own process 0.09 CPUs."""
    root = _root()
    stat = process.stat(root, pid)
    if stat is None:
        return None
    s = Snapshot(clocks.perf_counter(), stat.cpu_s)
    main = process.stat(root, pid, pid)
    s.thread_cpu_s = main.cpu_s if main is not None else None
    s.runq_s = runq_seconds(pid, root) if runq else None
    s.read_bytes = (process.io(root, pid) or {}).get("read_bytes")
    if uss:
        s.uss = process.uss(root, pid)
    return s


# The per-second reading of the other processes' CPUs: at least this long apart.
EACH_S = 0.9


@dataclass(frozen=True)
class Mark:
    """When the other processes' CPUs were last read, the machine's busy seconds and
    starvecheck's own CPU seconds then."""

    at: float
    busy: float | None
    ours: float | None


@dataclass
class Series:
    """One process over the window: its first and last snapshots and its CPU each
    second."""

    first: Snapshot
    last: Snapshot
    cpu_per_s: list[float] = field(default_factory=list)
    from_start: bool = True  # alive when the window began (not a new epoch's worker)

    @property
    def seconds(self) -> float:
        return max(0.0, self.last.at - self.first.at)

    def delta(self, name: str) -> float | None:
        a, b = getattr(self.first, name), getattr(self.last, name)
        return None if a is None or b is None else max(0.0, b - a)


@dataclass
class Fate:
    """What became of a rank over the window: the seconds it was seen stopped (State
    T/t), and whether it ended (`exited`, `exec'd`, `changed command`, `PID reused`)
    and when (seconds into the window)."""

    stopped_s: float = 0.0
    ended: str | None = None
    at_s: float | None = None


class Watch:
    """Reads each process `add`ed once a second (`tick`), and the machine and cgroup
    with them; `owner` keeps the rank each was added for. Each second it also keeps
    which processes were alive (`most_alive`: workers by identity, a new epoch's
    replacing the last's, not added to them) and what became of each rank (`fates`)."""

    def __init__(self, owned: dict[int, list[int]], cgroup_dir: str | None) -> None:
        self.series: dict[int, Series] = {}
        self.owner: dict[int, int] = {}
        self.cgroup_dir = cgroup_dir
        # The CPUs the job may run on, where fewer than the machine's: others are
        # read on those (what they take elsewhere is not the job's competition).
        self.cpus = allowed_cpus(next(iter(owned), 0)) if owned else None
        self.machine0 = _machine(self.cpus)
        self.cgroup0 = _cpu_stat(cgroup_dir)
        self.shm0 = shm_used()
        self.t0 = clocks.perf_counter()
        self._began = False  # processes added from here on started inside the window
        self.lives: dict[int, Life | None] = {o: read_life(o) for o in owned}
        self.fates: dict[int, Fate] = {o: Fate() for o in owned}
        for owner, pids in owned.items():
            for pid in (owner, *pids):
                self.add(pid, owner)
        # The CPUs other processes used, each second (their spread bounds the worker
        # model's prediction): the machine's busy time less the job's and starvecheck's
        # own (py-spy: gone once attach ends, so not the job's competition after).
        self.others_each: list[float] = []
        self._mark = Mark(self.t0, self.machine0, ours_cpu())
        self._job_since = 0.0  # the job's CPU seconds since the mark
        self.alive: list[set[int]] = [set(self.series)]
        self._began = True
        self._last_tick = self.t0

    def busy_since_start(self) -> tuple[float, float, int] | None:
        """(the CPU seconds the machine's CPUs (the job's allowed ones) were busy since
        this watch began, the seconds since, how many CPUs), or None where /proc/stat
        cannot be read: what was left idle before sampling starts."""
        now = _machine(self.cpus)
        if now is None or self.machine0 is None:
            return None
        return now - self.machine0, clocks.perf_counter() - self.t0, cpus_read(self.cpus) or 1

    def add(self, pid: int, owner: int) -> None:
        if pid in self.series:
            return
        s = snapshot(pid, uss=True, runq=pid != owner)
        if s is not None:
            self.series[pid] = Series(s, s, from_start=not self._began)
            self.owner[pid] = owner

    def most_alive(self, pids: list[int]) -> int:
        """The most of `pids` alive at once in any second read: the worker count, where
        the workers of two epochs in one window are not added up."""
        want = set(pids)
        return max((len(alive & want) for alive in self.alive), default=0)

    def owned(self, owner: int) -> list[int]:
        """The processes read for `owner`, not itself."""
        return sorted(p for p, o in self.owner.items() if o == owner and p != owner)

    def tick(self) -> None:
        alive: set[int] = set()
        for pid, series in self.series.items():
            s = snapshot(pid, runq=self.owner.get(pid) != pid)
            if s is None:
                continue  # exited: its last reading stands
            alive.add(pid)
            before = series.last
            if s.cpu_s is not None and before.cpu_s is not None and s.at > before.at:
                series.cpu_per_s.append((s.cpu_s - before.cpu_s) / (s.at - before.at))
                self._job_since += max(0.0, s.cpu_s - before.cpu_s)
            series.last = s
        self.alive.append(alive)
        now = clocks.perf_counter()
        for owner, fate in self.fates.items():
            follow(fate, self.lives.get(owner), read_life(owner), now - self._last_tick,
                   now - self.t0)  # fmt: skip
        self._last_tick = now
        self._others_tick()

    def _others_tick(self) -> None:
        """Another second's CPUs of the other processes, where a second has passed
        since the last (ticks come faster while py-spy finishes)."""
        now = clocks.perf_counter()
        if now - self._mark.at < EACH_S:
            return
        busy, mine = _machine(self.cpus), ours_cpu()
        m = self._mark
        if busy is not None and m.busy is not None:
            own = mine - m.ours if mine is not None and m.ours is not None else 0.0
            used = busy - m.busy - self._job_since - max(0.0, own)
            self.others_each.append(at_most_cpus(max(0.0, used / (now - m.at)), self.cpus))
        self._mark, self._job_since = Mark(now, busy, mine), 0.0

    def finish(self) -> dict[str, float | None]:
        """The last readings (USS again) and the machine's: CPUs other processes used
        (the machine's busy time less the job's), the cgroup's throttled periods and
        seconds, /dev/shm's growth."""
        for pid, series in self.series.items():
            s = snapshot(pid, uss=True, runq=self.owner.get(pid) != pid)
            if s is not None:
                series.last = s
        seconds = max(1e-9, clocks.perf_counter() - self.t0)
        machine1, cgroup1 = _machine(self.cpus), _cpu_stat(self.cgroup_dir)
        ours = sum(s.delta("cpu_s") or 0.0 for s in self.series.values())
        others = None
        if self.machine0 is not None and machine1 is not None:
            others = at_most_cpus(max(0.0, (machine1 - self.machine0 - ours) / seconds), self.cpus)
        out: dict[str, float | None] = {"seconds": seconds, "others_cpus": others}
        out["load_average"] = load_average()
        out["machine_cpus"] = float(cpus_read(self.cpus)) or None
        for key in ("nr_periods", "nr_throttled", "throttled_s"):
            a, b = self.cgroup0.get(key), cgroup1.get(key)
            out[key] = None if a is None or b is None else max(0.0, b - a)
        shm1 = shm_used()
        out["shm_used_bytes"] = shm1
        out["shm_growth_bytes"] = None if shm1 is None or self.shm0 is None else shm1 - self.shm0
        return out


def follow(fate: Fate, first: Life | None, now: Life | None, dt: float, at: float) -> None:
    """One second of a rank's life added to its `fate`: stopped for `dt` more seconds,
    or ended at `at` (gone, a zombie, or not the process first read)."""
    if fate.ended is not None or first is None:
        return
    ended = "exited" if now is None or now.ended else first.replaced_by(now)
    if ended is not None:
        fate.ended, fate.at_s = ended, round(at, 1)
    elif now is not None and now.stopped:
        fate.stopped_s += dt


def _machine(cpus: frozenset[int] | None) -> float | None:
    times = machine_times(cpus=cpus)
    return times.busy if times is not None else None


def _cpu_stat(directory: str | None) -> dict[str, float]:
    """nr_periods, nr_throttled and throttled seconds of a cgroup's cpu.stat (v1 or
    v2)."""
    text = _root().read(f"{directory}/cpu.stat").value if directory else None
    if not text:
        return {}
    stat = parse_flat_keyed(text)
    out = {k: float(stat[k]) for k in ("nr_periods", "nr_throttled") if k in stat}
    throttled = parse_throttled(text)
    if throttled is not None:
        out["throttled_s"] = throttled
    return out


def cgroup_dir(pid: int, root: SysRoot | None = None) -> str | None:
    """Where the CPU quota of `pid` is enforced, which is where its throttling is
    counted (probe/cgroup.py: v1, v2 and hybrid hosts, the tightest quota from its
    cgroup up to the mount), as a path under the machine's root; None where it has no
    cpu.stat."""
    return cpu_stat_dir(root or _root(), pid).value


def shm_used() -> float | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return float((st.f_blocks - st.f_bfree) * st.f_frsize)
