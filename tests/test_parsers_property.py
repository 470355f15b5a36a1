"""Garbage in, no exception out: every parser, and whole fake machines of garbled files.

Probes never raise (docs/architecture.md, principle 2): a truncated or mangled file in
/proc or /sys is normal on some machine somewhere.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starvecheck.advice.env import advise
from starvecheck.probe import cgroup, container, cpu, gpu, memory, mounts, nvml, software
from starvecheck.probe.machine import collect
from starvecheck.probe.nvml import FakeNvmlSource
from starvecheck.probe.sysroot import SysRoot

# Text shaped like kernel files: digits, separators and words they use, plus anything.
KERNEL_ALPHABET = st.sampled_from(
    [
        *list("0123456789abcdefx-,:/ \t\n.=%kKmMgG"),
        "max",
        "GT/s",
        "PCIe",
        "kB",
        "Node ",
        "processor",
        "physical id",
        "core id",
        "unlimited",
        " - ",
        "cgroup2",
        "cgroup",
        "tmpfs",
        "size=",
        "nr_periods",
        "nr_throttled",
    ]
)
kernelish = st.lists(KERNEL_ALPHABET, max_size=60).map("".join)
text = st.one_of(st.text(max_size=300), kernelish)

PARSERS = [
    cpu.parse_cpulist,
    cpu.parse_cpuinfo,
    lambda t: cpu.parse_status_field(t, "Cpus_allowed_list"),
    mounts.parse_mountinfo,
    lambda t: mounts.parse_tmpfs_size(t, 1024),
    mounts.classify_fs,
    cgroup.parse_proc_cgroup,
    cgroup.parse_cpu_max,
    cgroup.parse_int,
    cgroup.parse_flat_keyed,
    cgroup.parse_limit,
    memory.parse_meminfo,
    memory.parse_proc_limits,
    gpu.parse_link_speed,
    gpu.parse_link_width,
    nvml.normalise_bus_id,
    software.parse_torch_version_py,
    container.detect_runtime_from_cgroup,
    lambda t: FakeNvmlSource.from_text(t),
]


@given(text)
@settings(max_examples=300, deadline=None)
def test_no_parser_raises(garbage):
    for parse in PARSERS:
        parse(garbage)


@given(text)
def test_cpulist_parse_is_a_valid_set_or_none(garbage):
    cpus = cpu.parse_cpulist(garbage)
    assert cpus is None or all(0 <= c <= cpu.MAX_CPU_ID for c in cpus)
    if cpus:
        assert cpu.parse_cpulist(cpu.format_cpulist(cpus)) == cpus


# Every file the probes read; each gets garbage, nothing, or is left out.
PROBED_FILES = [
    "proc/self/status",
    "proc/self/cgroup",
    "proc/self/mountinfo",
    "proc/self/limits",
    "proc/cpuinfo",
    "proc/meminfo",
    "proc/sys/kernel/hostname",
    "proc/sys/kernel/osrelease",
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/cpu0/topology/core_id",
    "sys/devices/system/cpu/cpu0/topology/physical_package_id",
    "sys/devices/system/node/node0/cpulist",
    "sys/devices/system/node/node0/meminfo",
    "sys/fs/cgroup/cpu.max",
    "sys/fs/cgroup/cpu.stat",
    "sys/fs/cgroup/memory.max",
    "sys/fs/cgroup/pids.max",
    "sys/fs/cgroup/cpu/cpu.cfs_quota_us",
    "sys/fs/cgroup/cpu/cpu.cfs_period_us",
    "sys/fs/cgroup/memory/memory.limit_in_bytes",
    "sys/bus/pci/devices/0000:18:00.0/vendor",
    "sys/bus/pci/devices/0000:18:00.0/class",
    "sys/bus/pci/devices/0000:18:00.0/current_link_speed",
    "sys/bus/pci/devices/0000:18:00.0/max_link_width",
    "sys/bus/pci/devices/0000:18:00.0/numa_node",
    "sys/dev/block/254:1/queue/rotational",
    "starvecheck-fake-nvml.json",
]
# Plausible first lines, so garbage reaches deeper parsing than "not a number".
SEEDS = {
    "proc/self/mountinfo": "25 1 254:1 / / rw - ext4 /dev/vda1 rw\n"
    "30 25 0:27 / /dev/shm rw - tmpfs shm rw,size=65536k\n"
    "31 25 0:29 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
    "proc/self/cgroup": "0::/\n",
    "sys/bus/pci/devices/0000:18:00.0/vendor": "0x10de\n",
    "sys/bus/pci/devices/0000:18:00.0/class": "0x030200\n",
    "starvecheck-fake-nvml.json": '{"driver_version": "550", "devices": [{"index": 0}]}',
}

machine_files = st.dictionaries(
    st.sampled_from(PROBED_FILES),
    st.one_of(st.none(), text, text.map(lambda t: "\x00\xff" + t)),
    max_size=len(PROBED_FILES),
)


def _unexplained_nulls(value, path, explained):
    """Dotted paths (gpus[0].pcie.gen_max) of nulls that neither reason dict explains."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _unexplained_nulls(item, f"{path}.{key}" if path else key, explained)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _unexplained_nulls(item, f"{path}[{i}]", explained)
    elif value is None and path not in explained:
        yield path


@given(machine_files, st.booleans())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_garbled_machine_never_raises(files, seeded):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        contents = dict(SEEDS) if seeded else {}
        for name, value in files.items():
            if value is None:
                contents.pop(name, None)
            else:
                contents[name] = contents.get(name, "") + value
        for name, value in contents.items():
            p = root / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(
                value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
            )
        machine = collect(SysRoot(root), environ={})
        advise(machine)
        d = machine.to_dict()
        json.dumps(d, allow_nan=False)
        explained = set(d["unknown"]) | set(d["not_applicable"])
        top = {k: v for k, v in d.items() if k not in ("unknown", "not_applicable")}
        assert list(_unexplained_nulls(top, "", explained)) == []
