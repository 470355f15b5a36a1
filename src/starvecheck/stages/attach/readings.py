"""What /proc and the cgroup say of a running job over the seconds `attach` samples
it: each process's CPU (user+system), its threads' time runnable but waiting for a CPU,
its memory (USS at the start and the end, from smaps_rollup) and the bytes it read;
the machine's CPU; the cgroup's throttling; /dev/shm in use. Nothing is written
anywhere; a process that exits meanwhile keeps its last reading.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from starvecheck.probe.cgroup import parse_cpu_max, parse_flat_keyed
from starvecheck.probe.load import machine_times, parse_pid_stat, parse_throttled, runq_seconds

MAX_READ = 1 << 20


def _text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ).decode(errors="replace")
    except OSError:
        return None


@dataclass
class Snapshot:
    at: float
    cpu_s: float | None = None
    thread_cpu_s: float | None = None  # the process's main thread alone
    runq_s: float | None = None
    uss: int | None = None
    read_bytes: int | None = None


def snapshot(pid: int, uss: bool = False) -> Snapshot | None:
    stat = _text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    s = Snapshot(time.perf_counter(), parse_pid_stat(stat))
    main = _text(f"/proc/{pid}/task/{pid}/stat")
    s.thread_cpu_s = parse_pid_stat(main) if main else None
    s.runq_s = runq_seconds(pid)
    for line in (_text(f"/proc/{pid}/io") or "").splitlines():
        key, _, number = line.partition(":")
        if key == "read_bytes" and number.strip().isdigit():
            s.read_bytes = int(number)
    if uss:
        s.uss = _uss(pid)
    return s


def _uss(pid: int) -> int | None:
    """Private_Clean + Private_Dirty (+ swapped out private pages): what the process
    alone holds, from smaps_rollup (one summary, not the whole smaps)."""
    text = _text(f"/proc/{pid}/smaps_rollup")
    if text is None:
        return None
    total, seen = 0, False
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                total += int(parts[0]) * 1024
                seen = True
    return total if seen else None


@dataclass
class Series:
    """One process over the window: its first and last snapshots and its CPU each
    second."""

    first: Snapshot
    last: Snapshot
    cpu_per_s: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return max(0.0, self.last.at - self.first.at)

    def delta(self, name: str) -> float | None:
        a, b = getattr(self.first, name), getattr(self.last, name)
        return None if a is None or b is None else max(0.0, b - a)


class Watch:
    """Reads each process `add`ed once a second (`tick`), and the machine and cgroup
    with them; `owner` keeps the rank each was added for."""

    def __init__(self, owned: dict[int, list[int]], cgroup_dir: str | None) -> None:
        self.series: dict[int, Series] = {}
        self.owner: dict[int, int] = {}
        self.cgroup_dir = cgroup_dir
        self.machine0 = _machine()
        self.cgroup0 = _cpu_stat(cgroup_dir)
        self.shm0 = shm_used()
        self.t0 = time.perf_counter()
        for owner, pids in owned.items():
            for pid in (owner, *pids):
                self.add(pid, owner)

    def add(self, pid: int, owner: int) -> None:
        if pid in self.series:
            return
        s = snapshot(pid, uss=True)
        if s is not None:
            self.series[pid] = Series(s, s)
            self.owner[pid] = owner

    def owned(self, owner: int) -> list[int]:
        """The processes read for `owner`, not itself."""
        return sorted(p for p, o in self.owner.items() if o == owner and p != owner)

    def tick(self) -> None:
        for pid, series in self.series.items():
            s = snapshot(pid)
            if s is None:
                continue  # exited: its last reading stands
            before = series.last
            if s.cpu_s is not None and before.cpu_s is not None and s.at > before.at:
                series.cpu_per_s.append((s.cpu_s - before.cpu_s) / (s.at - before.at))
            series.last = s

    def finish(self) -> dict[str, float | None]:
        """The last readings (USS again) and the machine's: CPUs other processes used
        (the machine's busy time less the job's), the cgroup's throttled periods and
        seconds, /dev/shm's growth."""
        for pid, series in self.series.items():
            s = snapshot(pid, uss=True)
            if s is not None:
                series.last = s
        seconds = max(1e-9, time.perf_counter() - self.t0)
        machine1, cgroup1 = _machine(), _cpu_stat(self.cgroup_dir)
        ours = sum(s.delta("cpu_s") or 0.0 for s in self.series.values())
        others = None
        if self.machine0 is not None and machine1 is not None:
            others = max(0.0, (machine1 - self.machine0 - ours) / seconds)
        out: dict[str, float | None] = {"seconds": seconds, "others_cpus": others}
        for key in ("nr_periods", "nr_throttled", "throttled_s"):
            a, b = self.cgroup0.get(key), cgroup1.get(key)
            out[key] = None if a is None or b is None else max(0.0, b - a)
        shm1 = shm_used()
        out["shm_used_bytes"] = shm1
        out["shm_growth_bytes"] = None if shm1 is None or self.shm0 is None else shm1 - self.shm0
        return out


def _machine() -> float | None:
    times = machine_times()
    return times.busy if times is not None else None


def _cpu_stat(directory: str | None) -> dict[str, float]:
    """nr_periods, nr_throttled and throttled seconds of a cgroup's cpu.stat."""
    text = _text(os.path.join(directory, "cpu.stat")) if directory else None
    if not text:
        return {}
    stat = parse_flat_keyed(text)
    out = {k: float(stat[k]) for k in ("nr_periods", "nr_throttled") if k in stat}
    throttled = parse_throttled(text)
    if throttled is not None:
        out["throttled_s"] = throttled
    return out


def cgroup_dir(pid: int, root: str = "/sys/fs/cgroup") -> str | None:
    """Where the cgroup v2 CPU quota of `pid` is enforced, which is where its throttling
    is counted: of its own cgroup directory and each parent up to the mount, the one
    whose cpu.max allows the fewest CPUs (a pod's quota sits above its container's);
    its own directory where none sets a quota. None where it has no cpu.stat."""
    for line in (_text(f"/proc/{pid}/cgroup") or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            where = os.path.normpath(root + "/" + path.lstrip("/"))
            if where.startswith(root) and os.path.isfile(f"{where}/cpu.stat"):
                return _quota_dir(where, root)
    return None


def _quota_dir(leaf: str, root: str) -> str:
    best: tuple[float, str] | None = None
    d = leaf
    while True:
        parsed = parse_cpu_max(_text(f"{d}/cpu.max") or "")
        if parsed is not None and parsed[0] is not None and parsed[1] > 0:
            cpus = parsed[0] / parsed[1]
            if (best is None or cpus < best[0]) and os.path.isfile(f"{d}/cpu.stat"):
                best = (cpus, d)
        if d == root or not d.startswith(root + "/"):
            break
        d = os.path.dirname(d)
    return best[1] if best else leaf


def shm_used() -> float | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return float((st.f_blocks - st.f_bfree) * st.f_frsize)
