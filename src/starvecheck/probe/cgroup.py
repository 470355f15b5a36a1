"""cgroup v1 and v2: CPU quota, throttling, memory limit, pids limit, OOM kills.

Finding this process's cgroup directory (as the JVM's container support does):
  1. /proc/self/cgroup gives the cgroup path per hierarchy ("0::/kubepods/..."
     for v2, "4:memory:/docker/<id>" for v1);
  2. /proc/self/mountinfo gives where that hierarchy is mounted and which of its
     paths is the mount's root. Without a cgroup namespace Docker mounts the
     container's own cgroup at /sys/fs/cgroup/<ctrl> with root "/docker/<id>",
     while /proc/self/cgroup still says "/docker/<id>": the directory is then the
     mount point itself, not mount point + path;
  3. if the computed directory does not exist, fall back to the mount point.
Limits are the smallest along the path from that directory up to the mount point:
Kubernetes sets the CPU limit on the pod's cgroup as well as the container's, and a
parent's limit binds its children.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from starvecheck.probe.fact import Fact
from starvecheck.probe.mounts import Mount, read_mounts
from starvecheck.probe.sysroot import SysRoot
from starvecheck.probe.text import is_uint

# v1 writes "no limit" as the largest page-aligned counter: 0x7FFFFFFFFFFFF000
# on 4 KiB pages, a little less with 64 KiB pages (Arm). Anything this big is no limit.
V1_UNLIMITED_THRESHOLD = 2**62


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map controller -> path. The v2 entry ("0::/path") is under the key ""."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not is_uint(parts[0]) or not parts[2].startswith("/"):
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            paths[""] = path
            continue
        for ctrl in controllers.split(","):
            if ctrl:
                paths[ctrl] = path
    return paths


def parse_cpu_max(text: str) -> tuple[int | None, int] | None:
    """v2 cpu.max "QUOTA PERIOD" (QUOTA may be "max"): (quota_us or None, period_us)."""
    parts = text.split()
    if len(parts) not in (1, 2):
        return None
    period = 100_000
    if len(parts) == 2:
        if not is_uint(parts[1]) or int(parts[1]) == 0:
            return None
        period = int(parts[1])
    if parts[0] == "max":
        return None, period
    if not is_uint(parts[0]) or int(parts[0]) == 0:
        return None
    return int(parts[0]), period


def parse_int(text: str) -> int | None:
    text = text.strip()
    if text.startswith("-") and is_uint(text[1:]):
        return -int(text[1:])
    return int(text) if is_uint(text) else None


def parse_flat_keyed(text: str) -> dict[str, int]:
    """cpu.stat, memory.stat: "key value" lines; lines that are not that are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and is_uint(parts[1]):
            out[parts[0]] = int(parts[1])
    return out


def parse_limit(text: str) -> int | str | None:
    """memory.max / pids.max / memory.limit_in_bytes: an int, "max" for none, or None."""
    value = text.strip()
    if value == "max":
        return "max"
    number = parse_int(value)
    if number is None:
        return None
    if number < 0 or number >= V1_UNLIMITED_THRESHOLD:  # v1 uses -1 and 0x7FFF...F000
        return "max"
    return number


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    directory: str  # absolute path as seen from the sysroot, e.g. /sys/fs/cgroup/cpu
    mount_point: str


def _mount_for_controller(mounts: list[Mount], controller: str) -> Mount | None:
    """The v1 mount carrying `controller`, or the v2 mount for controller ""."""
    found = None
    for m in mounts:
        v2 = controller == "" and m.fstype == "cgroup2"
        v1 = m.fstype == "cgroup" and controller in m.super_options.split(",")
        if v2 or (controller and v1):
            found = m  # the last one listed is the one on top
    return found


def resolve(
    root: SysRoot, mounts: list[Mount], paths: dict[str, str], controller: str
) -> Hierarchy | None:
    """This process's cgroup directory for a v1 controller, or v2 when controller is ""."""
    mount = _mount_for_controller(mounts, controller)
    path = paths.get(controller)
    if mount is None or path is None:
        return None
    version = 2 if controller == "" else 1
    mroot = mount.root.rstrip("/") or "/"
    if mroot == "/":
        rel = path
    elif path == mroot or path.startswith(mroot + "/"):
        rel = path[len(mroot) :] or "/"
    else:
        rel = "/"  # our cgroup is outside the mounted subtree: only the mount is visible
    directory = posixpath.normpath(mount.mount_point + "/" + rel.lstrip("/"))
    if not root.exists(directory):
        directory = mount.mount_point
    return Hierarchy(version, directory, mount.mount_point)


def _levels(h: Hierarchy) -> list[str]:
    """Directories from the leaf up to and including the mount point."""
    out = [h.directory]
    d = h.directory
    while d != h.mount_point and d.startswith(h.mount_point) and d != "/":
        d = posixpath.dirname(d)
        out.append(d)
    return out


@dataclass(frozen=True)
class Throttling:
    nr_periods: int
    nr_throttled: int
    throttled_s: float
    directory: str

    @property
    def share(self) -> float:
        return self.nr_throttled / self.nr_periods if self.nr_periods else 0.0


@dataclass(frozen=True)
class CgroupFacts:
    version: Fact[int]
    mode: Fact[str]  # "v1", "v2" or "hybrid"
    cpu_directory: Fact[str]
    quota_cpus: Fact[float]
    quota_directory: Fact[str]
    throttling: Fact[Throttling]
    memory_limit: Fact[int]
    memory_usage: Fact[int]
    pids_limit: Fact[int]


def probe_cgroup(root: SysRoot, mounts: Fact[list[Mount]]) -> CgroupFacts:
    text = root.read("/proc/self/cgroup")
    if not mounts.known or not text.known:
        reason = f"cgroups unknown: {mounts.reason or text.reason}"
        u: Fact = Fact.unknown(reason)
        return CgroupFacts(u, u, u, u, u, u, u, u, u)
    mount_list = mounts.value or []
    paths = parse_proc_cgroup(text.value or "")
    has_v1 = any(m.fstype == "cgroup" for m in mount_list)
    has_v2 = any(m.fstype == "cgroup2" for m in mount_list)
    if not has_v1 and not has_v2:
        u = Fact.absent("no cgroup filesystem is mounted")
        return CgroupFacts(u, u, u, u, u, u, u, u, u)
    # Hybrid hosts mount v1 controllers and an empty v2 tree (systemd's "unified");
    # the controllers, and so the limits, are v1's.
    version = Fact.of(1 if has_v1 else 2)
    mode = Fact.of("hybrid" if has_v1 and has_v2 else "v1" if has_v1 else "v2")

    def hierarchy(ctrl: str) -> Hierarchy | None:
        return resolve(root, mount_list, paths, ctrl if has_v1 else "")

    cpu = hierarchy("cpu")
    mem = hierarchy("memory")
    pids = hierarchy("pids")
    quota, quota_dir = _cpu_quota(root, cpu)
    return CgroupFacts(
        version=version,
        mode=mode,
        cpu_directory=Fact.of(cpu.directory) if cpu else Fact.unknown("no cpu cgroup found"),
        quota_cpus=quota,
        quota_directory=quota_dir,
        throttling=_throttling(root, cpu, quota_dir.value),
        memory_limit=_min_limit(
            root,
            mem,
            "memory.max" if mem and mem.version == 2 else "memory.limit_in_bytes",
            "memory",
        ),
        memory_usage=_leaf_int(
            root, mem, "memory.current" if mem and mem.version == 2 else "memory.usage_in_bytes"
        ),
        pids_limit=_min_limit(root, pids, "pids.max", "pids"),
    )


def _cpu_quota(root: SysRoot, h: Hierarchy | None) -> tuple[Fact[float], Fact[str]]:
    if h is None:
        u: Fact = Fact.unknown("no cpu cgroup controller found for this process")
        return u, u
    best: tuple[float, str] | None = None
    readable = False
    for d in _levels(h):
        if h.version == 2:
            text = root.read(f"{d}/cpu.max")
            if not text.known:
                continue  # the root cgroup has no cpu.max
            parsed = parse_cpu_max(text.value or "")
            if parsed is None:
                continue
            readable = True
            quota, period = parsed
        else:
            q, p = root.read(f"{d}/cpu.cfs_quota_us"), root.read(f"{d}/cpu.cfs_period_us")
            if not (q.known and p.known):
                continue
            qv, pv = parse_int(q.value or ""), parse_int(p.value or "")
            if qv is None or pv is None or pv <= 0:
                continue
            readable = True
            quota, period = (qv if qv > 0 else None), pv  # v1 writes -1 for no quota
        if quota is not None:
            cpus = quota / period
            if best is None or cpus < best[0]:
                best = (cpus, d)
    if best is not None:
        return Fact.of(round(best[0], 3)), Fact.of(best[1])
    if readable or root.exists(h.directory):
        # The root cgroup has no cpu.max at all: no file is no quota, as "max" is.
        na: Fact = Fact.absent("no CPU quota is set (cpu.max / cfs_quota_us is unlimited)")
        return na, na
    u = Fact.unknown(f"no readable cpu.max or cpu.cfs_quota_us under {h.directory}")
    return u, u


def _throttling(root: SysRoot, h: Hierarchy | None, quota_dir: str | None) -> Fact[Throttling]:
    if h is None:
        return Fact.unknown("no cpu cgroup controller found for this process")
    # Throttling is counted where the quota is enforced, which may be a parent
    # (the pod) rather than our own cgroup (the container).
    directory = quota_dir or h.directory
    text = root.read(f"{directory}/cpu.stat")
    if not text.known:
        return Fact.unknown(text.reason or "no cpu.stat")
    stat = parse_flat_keyed(text.value or "")
    if "nr_periods" not in stat or "nr_throttled" not in stat:
        if quota_dir is None:
            # The root cgroup's cpu.stat has usage but no bandwidth lines: with no
            # quota anywhere there is nothing to throttle.
            return Fact.absent("no CPU quota, so no throttling is counted")
        return Fact.unknown(f"{directory}/cpu.stat has no nr_periods/nr_throttled")
    if "throttled_usec" in stat:
        seconds = stat["throttled_usec"] / 1e6
    elif "throttled_time" in stat:  # v1, nanoseconds
        seconds = stat["throttled_time"] / 1e9
    else:
        seconds = 0.0
    return Fact.of(Throttling(stat["nr_periods"], stat["nr_throttled"], seconds, directory))


def _min_limit(root: SysRoot, h: Hierarchy | None, filename: str, what: str) -> Fact[int]:
    if h is None:
        return Fact.unknown(f"no {what} cgroup controller found for this process")
    best: int | None = None
    readable = False
    for d in _levels(h):
        text = root.read(f"{d}/{filename}")
        if not text.known:
            continue
        value = parse_limit(text.value or "")
        if value is None:
            continue
        readable = True
        if isinstance(value, int) and (best is None or value < best):
            best = value
    if best is not None:
        return Fact.of(best)
    if readable:
        return Fact.absent(f"no cgroup {what} limit is set ({filename} is unlimited)")
    if root.exists(h.directory):
        return Fact.absent(
            f"no cgroup {what} limit: {h.directory} has no {filename} (the root cgroup has none)"
        )
    return Fact.unknown(f"no readable {filename} under {h.directory}")


def _leaf_int(root: SysRoot, h: Hierarchy | None, filename: str) -> Fact[int]:
    if h is None:
        return Fact.unknown("no memory cgroup controller found for this process")
    text = root.read(f"{h.directory}/{filename}")
    value = parse_int(text.value or "") if text.known else None
    if value is None:
        return Fact.unknown(f"no readable {filename} in {h.directory}")
    return Fact.of(value)


def _own(root: SysRoot, controller: str) -> Hierarchy | None:
    """This process's cgroup directory for a v1 controller or, where no v1 hierarchy
    is mounted, v2's (probe_cgroup's choice); None where it cannot be read."""
    return of_process(root, controller, "self")


def of_process(root: SysRoot, controller: str, pid: int | str) -> Hierarchy | None:
    """Process `pid`'s cgroup directory for a v1 controller, else v2's: v1 where the
    controller is mounted there (v1 and hybrid hosts), v2 where it is not. Its
    /proc/PID/cgroup paths are relative to our cgroup namespace, as our mounts are, so
    our mount table resolves them. None where either cannot be read."""
    mounts, text = read_mounts(root), root.read(f"/proc/{pid}/cgroup")
    if not (mounts.known and text.known):
        return None
    mount_list = mounts.value or []
    paths = parse_proc_cgroup(text.value or "")
    if controller and any(m.fstype == "cgroup" for m in mount_list):
        found = resolve(root, mount_list, paths, controller)
        if found is not None:
            return found
    return resolve(root, mount_list, paths, "")


def cpu_stat_dir(root: SysRoot, pid: int | str) -> Fact[str]:
    """Where process `pid`'s CPU throttling is counted: the directory of the tightest
    CPU quota from its cgroup up to the mount (a pod's quota sits above its
    container's), v1 (`cpu,cpuacct`), v2 or hybrid; its own cgroup where no quota is
    set. Unknown, with the reason, where that directory has no cpu.stat."""
    h = of_process(root, "cpu", pid)
    if h is None:
        return Fact.unknown(f"the cpu cgroup of PID {pid} cannot be read")
    _, quota_dir = _cpu_quota(root, h)
    directory = quota_dir.value or h.directory
    if not root.exists(f"{directory}/cpu.stat"):
        return Fact.unknown(f"{directory} has no cpu.stat")
    return Fact.of(directory)


def throttling_of(root: SysRoot, pid: int | str) -> Fact[Throttling]:
    """Process `pid`'s cgroup's throttling counters now (see cpu_stat_dir)."""
    h = of_process(root, "cpu", pid)
    if h is None:
        return Fact.unknown(f"the cpu cgroup of PID {pid} cannot be read")
    return _throttling(root, h, _cpu_quota(root, h)[1].value)


def oom_kills(root: SysRoot) -> tuple[int, str] | None:
    """(processes the OOM killer has killed, the file that counts them): this process's
    memory cgroup's `oom_kill` (v2 memory.events, v1 memory.oom_control; kernels 4.13
    and later), else the machine's (/proc/vmstat). None where neither can be read."""
    h = _own(root, "memory")
    if h is not None:
        path = f"{h.directory}/{'memory.events' if h.version == 2 else 'memory.oom_control'}"
        count = parse_flat_keyed(root.read(path).value or "").get("oom_kill")
        if count is not None:
            return count, path
    count = parse_flat_keyed(root.read("/proc/vmstat").value or "").get("oom_kill")
    return None if count is None else (count, "/proc/vmstat")


def pids_free(root: SysRoot) -> int | None:
    """The tasks (processes and threads) this process's cgroup can still start: the
    tightest pids.max less its pids.current, from this cgroup up to the mount. None
    where no limit is set or none can be read."""
    h = _own(root, "pids")
    return None if h is None else _tightest_room(root, h, "pids.max", "pids.current")


def memory_free(root: SysRoot) -> int | None:
    """The bytes this process's memory cgroup can still take: the tightest limit less
    its usage, from this cgroup up to the mount (v2 memory.max and memory.current, v1
    memory.limit_in_bytes and memory.usage_in_bytes). None where no limit is set or
    none can be read."""
    h = _own(root, "memory")
    if h is None:
        return None
    if h.version == 2:
        return _tightest_room(root, h, "memory.max", "memory.current")
    return _tightest_room(root, h, "memory.limit_in_bytes", "memory.usage_in_bytes")


def _tightest_room(root: SysRoot, h: Hierarchy, limit_name: str, usage_name: str) -> int | None:
    """The least of a limit less its usage over the levels from `h`'s cgroup up to the
    mount (0 where usage is over the limit); None where no level has both."""
    free: int | None = None
    for d in _levels(h):
        limit = parse_limit(root.read(f"{d}/{limit_name}").value or "")
        usage = parse_int(root.read(f"{d}/{usage_name}").value or "")
        if isinstance(limit, int) and usage is not None:
            room = max(0, limit - usage)
            free = room if free is None else min(free, room)
    return free
