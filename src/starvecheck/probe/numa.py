"""NUMA nodes: their CPUs and memory, from /sys/devices/system/node."""

from __future__ import annotations

import re
from dataclasses import dataclass

from starvecheck.probe.cpu import parse_cpulist
from starvecheck.probe.fact import Fact
from starvecheck.probe.memory import parse_meminfo
from starvecheck.probe.sysroot import SysRoot

NODE_DIR = "/sys/devices/system/node"


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: frozenset[int] | None
    memory_bytes: int | None


def probe_numa(root: SysRoot) -> Fact[list[NumaNode]]:
    if not root.exists(NODE_DIR):
        return Fact.unknown(
            f"{NODE_DIR} does not exist (kernel built without NUMA, or a "
            "sandbox hides it): treat the machine as one node"
        )
    nodes: list[NumaNode] = []
    for name in root.listdir(NODE_DIR):
        m = re.fullmatch(r"node(\d+)", name)
        if not m:
            continue
        cpus_text = root.read(f"{NODE_DIR}/{name}/cpulist")
        mem_text = root.read(f"{NODE_DIR}/{name}/meminfo")
        cpus = parse_cpulist(cpus_text.value or "") if cpus_text.known else None
        mem = parse_meminfo(mem_text.value or "").get("MemTotal") if mem_text.known else None
        nodes.append(NumaNode(int(m.group(1)), cpus, mem))
    if not nodes:
        return Fact.unknown(f"{NODE_DIR} lists no node directories")
    return Fact.of(sorted(nodes, key=lambda n: n.id))
