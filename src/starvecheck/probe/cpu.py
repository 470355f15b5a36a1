"""CPU facts: model, logical and physical cores, this process's affinity.

Parsers are pure functions of text so tests can feed them anything; probes read
through the SysRoot and never raise.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from starvecheck.probe.fact import Fact
from starvecheck.probe.sysroot import SysRoot
from starvecheck.probe.text import is_uint

# The kernel caps a cpulist at NR_CPUS (8192 at most in distribution kernels);
# a bigger range in a garbled file would otherwise build a huge set.
MAX_CPU_ID = 65535


def parse_cpulist(text: str) -> frozenset[int] | None:
    """Parse a kernel cpulist ("0-3,8,10-11", "0-63:2" strides too); None when garbled."""
    text = text.strip()
    if not text:
        return frozenset()  # an empty list is valid: a memory-only NUMA node has no CPUs
    cpus: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+)(?::(\d+)(?:/(\d+))?)?)?\s*", part)
        if not m:
            return None
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        # "a-b:used/group" (bitmap_parselist): take `used` CPUs of every `group`.
        used = int(m.group(3)) if m.group(3) is not None else 1
        group = int(m.group(4)) if m.group(4) is not None else used
        if hi < lo or hi > MAX_CPU_ID or used < 1 or group < used:
            return None
        if m.group(3) is None:
            cpus.update(range(lo, hi + 1))
        else:
            cpus.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
    return frozenset(cpus)


def format_cpulist(cpus: frozenset[int] | set[int]) -> str:
    """The kernel's compact form: {0,1,2,5} -> "0-2,5"."""
    out: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def parse_status_field(text: str, name: str) -> str | None:
    """A field of /proc/<pid>/status ("Name:\\tvalue")."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


@dataclass(frozen=True)
class CpuInfo:
    model: str | None
    logical: int  # processor blocks
    physical: int | None  # distinct (physical id, core id) pairs; None when not listed


def parse_cpuinfo(text: str) -> CpuInfo | None:
    """x86 and Arm /proc/cpuinfo. Arm lists no "physical id"/"core id": physical is None."""
    blocks = [b for b in re.split(r"\n\s*\n", text) if b.strip()]
    processors = 0
    model: str | None = None
    cores: set[tuple[str, str]] = set()
    complete = True
    for block in blocks:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" not in fields or not is_uint(fields["processor"]):
            continue
        processors += 1
        model = model or fields.get("model name") or fields.get("Model") or None
        if "physical id" in fields and "core id" in fields:
            cores.add((fields["physical id"], fields["core id"]))
        else:
            complete = False
    if processors == 0:
        return None
    return CpuInfo(model, processors, len(cores) if complete and cores else None)


def parse_hypervisor(text: str) -> bool | None:
    """Whether /proc/cpuinfo says this kernel runs under a hypervisor (the x86
    "hypervisor" CPU flag). None when it lists no flags at all (Arm lists
    "Features"; there the question stays open)."""
    flags = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    if flags is None:
        return None
    return "hypervisor" in flags.group(1).split()


@dataclass(frozen=True)
class CpuFacts:
    model: Fact[str]
    logical: Fact[int]
    physical: Fact[int]
    affinity: Fact[frozenset[int]]


def probe_cpu(root: SysRoot) -> CpuFacts:
    cpuinfo_text = root.read("/proc/cpuinfo")
    info = parse_cpuinfo(cpuinfo_text.value) if cpuinfo_text.known else None
    return CpuFacts(
        model=_model(root, info, cpuinfo_text),
        logical=_logical(root, info),
        physical=_physical(root, info),
        affinity=probe_affinity(root),
    )


def _model(root: SysRoot, info: CpuInfo | None, raw: Fact[str]) -> Fact[str]:
    if info and info.model:
        return Fact.of(info.model)
    if not raw.known:
        return Fact.unknown(raw.reason or "no /proc/cpuinfo")
    return Fact.unknown("/proc/cpuinfo names no model (common on Arm)")


def _logical(root: SysRoot, info: CpuInfo | None) -> Fact[int]:
    # What os.cpu_count() returns: sysconf(_SC_NPROCESSORS_ONLN), i.e. the online
    # CPUs of the whole machine, regardless of affinity or quota.
    online = root.read("/sys/devices/system/cpu/online")
    if online.known:
        cpus = parse_cpulist(online.value or "")
        if cpus:
            return Fact.of(len(cpus))
    if info:
        return Fact.of(info.logical)
    if root.real and os.cpu_count():
        return Fact.of(os.cpu_count() or 0)
    return Fact.unknown("neither /sys/devices/system/cpu/online nor /proc/cpuinfo is readable")


def _physical(root: SysRoot, info: CpuInfo | None) -> Fact[int]:
    if info and info.physical:
        return Fact.of(info.physical)
    # Arm and some VMs: count distinct (package, core) pairs from sysfs topology.
    cores: set[tuple[str, str]] = set()
    for name in root.listdir("/sys/devices/system/cpu"):
        if not re.fullmatch(r"cpu\d+", name):
            continue
        base = f"/sys/devices/system/cpu/{name}/topology"
        package, core = root.read(f"{base}/physical_package_id"), root.read(f"{base}/core_id")
        if package.known and core.known:
            cores.add(((package.value or "").strip(), (core.value or "").strip()))
    if cores:
        return Fact.of(len(cores))
    return Fact.unknown("no core ids in /proc/cpuinfo or /sys/devices/system/cpu/*/topology")


def probe_affinity(root: SysRoot) -> Fact[frozenset[int]]:
    """The CPUs this process may run on (taskset, cpuset cgroups and numactl all show here)."""
    status = root.read("/proc/self/status")
    if status.known:
        field = parse_status_field(status.value or "", "Cpus_allowed_list")
        cpus = parse_cpulist(field) if field is not None else None
        if cpus:
            return Fact.of(cpus)
        reason = "Cpus_allowed_list missing or garbled in /proc/self/status"
    else:
        reason = status.reason or "no /proc/self/status"
    # Fallback for kernels or sandboxes without the status field; only for the
    # real machine, since a fake sysroot is some other machine.
    if root.real and hasattr(os, "sched_getaffinity"):
        try:
            return Fact.of(frozenset(os.sched_getaffinity(0)))
        except OSError as e:
            reason += f"; sched_getaffinity failed: {e}"
    return Fact.unknown(reason)


def under_hypervisor() -> bool:
    from starvecheck.probe.sysroot import SysRoot

    text = SysRoot.from_environ({}).read("/proc/cpuinfo")
    return bool(text.known and parse_hypervisor(text.value or ""))
