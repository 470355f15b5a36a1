"""Parsers are pure functions of text: each is checked against real file contents."""

from __future__ import annotations

import pytest

from starvecheck.core.units import format_bytes, parse_size
from starvecheck.probe.cgroup import (
    parse_cpu_max,
    parse_flat_keyed,
    parse_limit,
    parse_proc_cgroup,
)
from starvecheck.probe.container import detect_runtime_from_cgroup
from starvecheck.probe.cpu import (
    format_cpulist,
    parse_cpuinfo,
    parse_cpulist,
    parse_hypervisor,
    parse_status_field,
)
from starvecheck.probe.gpu import parse_link_speed, parse_link_width, theoretical_gbps
from starvecheck.probe.memory import parse_meminfo, parse_proc_limits
from starvecheck.probe.mounts import classify_fs, mount_for, parse_mountinfo, parse_tmpfs_size
from starvecheck.probe.nvml import affinity_words_to_cpulist, normalise_bus_id
from starvecheck.probe.software import parse_torch_version_py


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-3", {0, 1, 2, 3}),
        ("0-1,4,6-7", {0, 1, 4, 6, 7}),
        ("0", {0}),
        ("", set()),
        ("0-27,56-83", set(range(28)) | set(range(56, 84))),
        ("0-7:2/4", {0, 1, 4, 5}),
        ("\n0-1\n", {0, 1}),
    ],
)
def test_parse_cpulist(text, expected):
    assert parse_cpulist(text) == frozenset(expected)


@pytest.mark.parametrize("text", ["a-b", "3-1", "1,,2", "-1", "0-99999999", "0-7:3/2"])
def test_parse_cpulist_garbled_is_none(text):
    assert parse_cpulist(text) is None


def test_format_cpulist_round_trips():
    cpus = frozenset(range(28)) | frozenset(range(56, 84)) | {100}
    assert format_cpulist(cpus) == "0-27,56-83,100"
    assert parse_cpulist(format_cpulist(cpus)) == cpus
    assert format_cpulist(frozenset()) == ""


STATUS = (
    "Name:\tpython3\nCpus_allowed:\tffff,ffffffff\nCpus_allowed_list:\t0-47\n"
    "Mems_allowed_list:\t0-1\n"
)


def test_status_field():
    assert parse_status_field(STATUS, "Cpus_allowed_list") == "0-47"
    assert parse_status_field(STATUS, "Missing") is None


CPUINFO_X86 = "\n\n".join(
    f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338\n"
    f"physical id\t: {i // 4}\nsiblings\t: 4\ncore id\t\t: {i % 2}\ncpu cores\t: 2"
    for i in range(8)
)
CPUINFO_ARM = (
    "processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n\nprocessor\t: 1\nBogoMIPS\t: 50.00\n"
)


def test_cpuinfo_x86_counts_physical_cores_per_socket():
    info = parse_cpuinfo(CPUINFO_X86)
    assert info is not None
    assert (info.model, info.logical, info.physical) == ("Intel(R) Xeon(R) Gold 6338", 8, 4)


def test_cpuinfo_arm_has_no_physical_ids():
    info = parse_cpuinfo(CPUINFO_ARM)
    assert info is not None and info.logical == 2 and info.physical is None and info.model is None


def test_cpuinfo_garbage():
    assert parse_cpuinfo("hello\nworld") is None


MOUNTINFO = r"""22 1 0:21 / /proc rw,nosuid - proc proc rw
30 25 0:27 / /dev/shm rw,relatime - tmpfs shm rw,size=65536k
31 25 0:28 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=1048576k
27 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,discard
40 27 0:53 / /mnt/my\040data rw,relatime - nfs4 10.0.0.1:/export rw,vers=4.1
41 31 0:38 /docker/abc /sys/fs/cgroup/memory ro,nosuid master:9 - cgroup cgroup rw,memory
"""


def test_mountinfo_fields_and_escapes():
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 6
    cg = mounts[-1]
    assert (cg.root, cg.mount_point, cg.fstype, cg.super_options) == (
        "/docker/abc",
        "/sys/fs/cgroup/memory",
        "cgroup",
        "rw,memory",
    )
    assert mounts[4].mount_point == "/mnt/my data"
    assert (mounts[3].major, mounts[3].minor) == (254, 1)
    assert mounts[1].option("size") == "65536k" and mounts[1].option("rw") == ""
    assert mounts[1].option("nope") is None


def test_mount_for_longest_prefix_and_stacking():
    mounts = parse_mountinfo(MOUNTINFO)
    assert mount_for(mounts, "/mnt/my data/train/x.bin").fstype == "nfs4"
    assert mount_for(mounts, "/mnt/my datax").mount_point == "/"
    assert mount_for(mounts, "/dev/shm").source == "tmpfs"  # the later mount is on top
    assert mount_for(mounts, "/home/user/../user").mount_point == "/"


@pytest.mark.parametrize(
    ("value", "total", "expected"),
    [
        ("65536k", None, 64 * 1024**2),
        ("8g", None, 8 * 1024**3),
        ("1048576", None, 1048576),
        ("50%", 16 * 1024**3, 8 * 1024**3),
        ("50%", None, None),
        ("lots", None, None),
    ],
)
def test_tmpfs_size(value, total, expected):
    assert parse_tmpfs_size(value, total) == expected


@pytest.mark.parametrize(
    ("fstype", "kind", "network"),
    [
        ("nfs4", "network", True),
        ("lustre", "network", True),
        ("fuse.gcsfuse", "fuse", True),
        ("fuse", "fuse", True),
        ("ext4", "local", False),
        ("xfs", "local", False),
        ("tmpfs", "memory", False),
        ("overlay", "local", False),
    ],
)
def test_classify_fs(fstype, kind, network):
    assert classify_fs(fstype) == (kind, network)


def test_proc_cgroup_v1_and_v2():
    text = (
        "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n"
        "0::/docker/abc\nbroken line\n"
    )
    paths = parse_proc_cgroup(text)
    assert paths["cpu"] == paths["cpuacct"] == paths["memory"] == "/docker/abc"
    assert paths[""] == "/docker/abc"
    assert paths["name=systemd"] == "/docker/abc"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("200000 100000\n", (200000, 100000)),
        ("max 100000", (None, 100000)),
        ("150000 100000", (150000, 100000)),
        ("max", (None, 100000)),
        ("0 100000", None),
        ("abc def", None),
        ("100 0", None),
        ("", None),
    ],
)
def test_cpu_max(text, expected):
    assert parse_cpu_max(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max\n", "max"),
        ("17179869184", 17179869184),
        ("9223372036854771712", "max"),
        ("-1", "max"),
        ("4096", 4096),
        ("lots", None),
        ("", None),
    ],
)
def test_limit(text, expected):
    assert parse_limit(text) == expected


def test_flat_keyed_cpu_stat_v1_and_v2():
    v2 = "usage_usec 912345678\nnr_periods 184210\nnr_throttled 40311\nthrottled_usec 3021445120\n"
    assert parse_flat_keyed(v2)["nr_throttled"] == 40311
    v1 = "nr_periods 0\nnr_throttled 0\nthrottled_time 0\ngarbage\nx y z\n"
    assert parse_flat_keyed(v1) == {"nr_periods": 0, "nr_throttled": 0, "throttled_time": 0}


def test_meminfo_machine_and_node():
    assert parse_meminfo("MemTotal:       16384 kB\nHugePages_Total:       0\n") == {
        "MemTotal": 16384 * 1024,
        "HugePages_Total": 0,
    }
    assert parse_meminfo("Node 1 MemTotal:       263921588 kB\n") == {"MemTotal": 263921588 * 1024}


LIMITS = """Limit                     Soft Limit           Hard Limit           Units     
Max open files            1024                 524288               files     
Max locked memory         8388608              8388608              bytes     
Max address space         unlimited            unlimited            bytes     
Max nice priority         0                    0                    
"""  # noqa: W291  (the kernel pads every column, trailing blanks included)


def test_proc_limits():
    table = parse_proc_limits(LIMITS)
    assert table["Max open files"] == (1024, 524288)
    assert table["Max locked memory"] == (8388608, 8388608)
    assert table["Max address space"] == ("unlimited", "unlimited")
    assert table["Max nice priority"] == (0, 0)


@pytest.mark.parametrize(
    ("text", "gen"),
    [
        ("2.5 GT/s PCIe", 1),
        ("5.0 GT/s PCIe", 2),
        ("8.0 GT/s PCIe", 3),
        ("16.0 GT/s PCIe", 4),
        ("32.0 GT/s PCIe", 5),
        ("64.0 GT/s PCIe", 6),
        ("8 GT/s", 3),
        ("Unknown", None),
        ("3.0 GT/s", None),
        ("", None),
    ],
)
def test_link_speed(text, gen):
    assert parse_link_speed(text) == gen


@pytest.mark.parametrize(
    ("text", "width"), [("16", 16), ("8\n", 8), ("x4", 4), ("0", None), ("255", None), ("", None)]
)
def test_link_width(text, width):
    assert parse_link_width(text) == width


def test_theoretical_bandwidth_matches_published_figures():
    assert theoretical_gbps(3, 16) == 15.76
    assert theoretical_gbps(4, 16) == 31.5
    assert theoretical_gbps(5, 16) == 63.01
    assert theoretical_gbps(5, 8) == 31.5
    assert theoretical_gbps(None, 16) is None


def test_bus_id_normalisation():
    assert normalise_bus_id("00000000:2A:00.0") == "0000:2a:00.0"
    assert normalise_bus_id("0000:2a:00.0") == "0000:2a:00.0"
    assert normalise_bus_id("garbage") is None
    assert normalise_bus_id("zz:zz:zz.z") is None


def test_nvml_affinity_bitmask():
    assert affinity_words_to_cpulist([0xF]) == "0-3"
    # CPUs 28-55 and 84-111 of a 112-CPU machine: two 64-bit words.
    cpus = set(range(28, 56)) | set(range(84, 112))
    words = [sum(1 << (c - 64 * w) for c in cpus if 64 * w <= c < 64 * (w + 1)) for w in (0, 1)]
    assert affinity_words_to_cpulist(words) == "28-55,84-111"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n", None),
        ("cuda: Optional[str] = '12.4'\n", "12.4"),
        ('cuda = "11.8"\n', "11.8"),
        ("nothing here", False),
    ],
)
def test_torch_version_py(text, expected):
    assert parse_torch_version_py(text) == expected


@pytest.mark.parametrize(
    ("text", "runtime"),
    [
        ("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope", "containerd"),
        ("0::/machine.slice/libpod-0123456789abcdef.scope", "podman"),
        ("12:memory:/docker/0123456789abcdef0123", "docker"),
        ("0::/system.slice/docker-0123456789abcdef0123.scope", "docker"),
        ("0::/kubepods/burstable/pod1/crio-abc", "cri-o"),
        ("0::/user.slice/user-1000.slice/session-4.scope", None),
    ],
)
def test_runtime_from_cgroup(text, runtime):
    assert detect_runtime_from_cgroup(text) == runtime


def test_units():
    assert format_bytes(64 * 1024**2) == "64 MiB"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(None) == "unknown"
    assert parse_size("16K") == 16384 and parse_size("4MiB") == 4 * 1024**2
    assert parse_size("1.5G") == int(1.5 * 1024**3) and parse_size("ten") is None


def test_non_ascii_digits_are_not_numbers():
    # Found by hypothesis: "²".isdigit() is True but int("²") raises.
    from starvecheck.probe.cgroup import parse_int

    assert parse_int("²") is None and parse_limit("²") is None
    assert parse_link_width("²") is None and parse_cpu_max("² 100000") is None
    assert parse_proc_limits("h\nMax open files  ²  ²  files\n") == {}


def test_installed_versions_from_dist_info_names(tmp_path):
    from starvecheck.probe.software import installed_versions, package_version

    for name in (
        "torch-2.13.0+cpu.dist-info",
        "mosaicml_streaming-0.13.0.dist-info",
        "not_a_dist",
        "broken.dist-info",
    ):
        (tmp_path / name).mkdir()
    found = installed_versions([str(tmp_path), str(tmp_path / "missing")])
    assert found == {"torch": "2.13.0+cpu", "mosaicml_streaming": "0.13.0"}
    assert package_version("mosaicml-streaming", found).value == "0.13.0"
    missing = package_version("surely-not-installed-starvecheck-test", found)
    assert missing.value is None and missing.not_applicable


def test_parse_hypervisor_reads_the_x86_flag():
    vm = "processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor lahf_lm\n"
    metal = "processor\t: 0\nflags\t\t: fpu vme sse2 lahf_lm\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm\n"
    assert parse_hypervisor(vm) is True
    assert parse_hypervisor(metal) is False
    assert parse_hypervisor(arm) is None  # Arm lists no flags: unknown, not "no"
    assert parse_hypervisor("flags : hypervisor_x\n") is False  # whole words only
