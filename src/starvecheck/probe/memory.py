"""Memory: /proc/meminfo totals, and the rlimits that matter to a training job."""

from __future__ import annotations

import re
from dataclasses import dataclass

from starvecheck.probe.fact import Fact
from starvecheck.probe.sysroot import SysRoot
from starvecheck.probe.text import is_uint


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo and /sys/devices/system/node/nodeN/meminfo -> {key: bytes}.

    Node files prefix each line with "Node N "; values are in kB (KiB) where a
    unit is given, plain counts (HugePages_Total) otherwise.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(?:Node\s+\d+\s+)?([\w()]+):\s+(\d+)(?:\s+(kB))?\s*", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return out


@dataclass(frozen=True)
class MemoryFacts:
    total: Fact[int]
    available: Fact[int]
    swap_total: Fact[int]
    swap_free: Fact[int]


def probe_memory(root: SysRoot) -> MemoryFacts:
    text = root.read("/proc/meminfo")
    info = parse_meminfo(text.value or "") if text.known else {}

    def get(key: str) -> Fact[int]:
        if key in info:
            return Fact.of(info[key])
        return Fact.unknown(text.reason if not text.known else f"{key} missing from /proc/meminfo")

    return MemoryFacts(get("MemTotal"), get("MemAvailable"), get("SwapTotal"), get("SwapFree"))


# ---------------------------------------------------------------- rlimits

UNLIMITED = "unlimited"


def parse_proc_limits(text: str) -> dict[str, tuple[int | str, int | str]]:
    """/proc/<pid>/limits -> {"Max locked memory": (soft, hard)}; "unlimited" kept as text."""
    out: dict[str, tuple[int | str, int | str]] = {}
    for line in text.splitlines()[1:]:
        # Columns are fixed-width in the kernel's format, but names have spaces:
        # split on runs of 2+ spaces instead of trusting widths.
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) < 3:
            continue
        name, soft, hard = parts[0], parts[1], parts[2]
        values: list[int | str] = []
        for v in (soft, hard):
            if v == UNLIMITED:
                values.append(UNLIMITED)
            elif is_uint(v):
                values.append(int(v))
            else:
                break
        if len(values) == 2:
            out[name] = (values[0], values[1])
    return out


@dataclass(frozen=True)
class LimitsFacts:
    nofile_soft: Fact[int]
    nofile_hard: Fact[int]
    memlock_soft: Fact[int]  # absent (not applicable) when unlimited
    memlock_hard: Fact[int]


def _limit_fact(value: int | str, what: str) -> Fact[int]:
    if value == UNLIMITED:
        return Fact.absent(f"{what} is unlimited")
    return Fact.of(int(value))


def probe_limits(root: SysRoot) -> LimitsFacts:
    text = root.read("/proc/self/limits")
    table = parse_proc_limits(text.value or "") if text.known else {}
    if not table and root.real:
        table = _getrlimit_table()
    reason = text.reason if not text.known else "not listed in /proc/self/limits"

    def pair(name: str, what: str) -> tuple[Fact[int], Fact[int]]:
        if name not in table:
            return Fact.unknown(reason or "unknown"), Fact.unknown(reason or "unknown")
        soft, hard = table[name]
        return _limit_fact(soft, f"{what} (soft)"), _limit_fact(hard, f"{what} (hard)")

    nofile = pair("Max open files", "RLIMIT_NOFILE")
    memlock = pair("Max locked memory", "RLIMIT_MEMLOCK")
    return LimitsFacts(nofile[0], nofile[1], memlock[0], memlock[1])


def _getrlimit_table() -> dict[str, tuple[int | str, int | str]]:
    # Fallback for the real machine when /proc/self/limits is hidden (some sandboxes).
    import resource

    def conv(v: int) -> int | str:
        return UNLIMITED if v == resource.RLIM_INFINITY else v

    out: dict[str, tuple[int | str, int | str]] = {}
    for name, res in (
        ("Max open files", resource.RLIMIT_NOFILE),
        ("Max locked memory", resource.RLIMIT_MEMLOCK),
    ):
        try:
            soft, hard = resource.getrlimit(res)
        except (OSError, ValueError):
            continue
        out[name] = (conv(soft), conv(hard))
    return out
