"""How attach finds the job on fake machines (tests/fixtures, docs/fake-machines.md): PID
1 read like any process, ranks told from their DataLoader workers, py-spy's thread ids
mapped through NSpid, throttling from v1, v2 and hybrid cgroup trees, and why ptrace was
refused; and the parsers of probe/process.py against known text and garbage."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.core.status import UsageError
from starvecheck.probe import cgroup, process
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.attach import ids
from starvecheck.stages.attach.readings import _cpu_stat, cgroup_dir
from starvecheck.stages.attach.spy import Stacks, _last, _why, parse_raw
from starvecheck.stages.attach.target import Process, find, ranks_of

TORCH_MAPS = (
    "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libpython3.11.so.1.0\n"
    "7f02-7f03 r-xp 00000000 08:01 2 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so\n"
)
PLAIN_MAPS = "7f00-7f01 r-xp 00000000 08:01 1 /usr/bin/bash\n"


def write(base: Path, path: str, text: str) -> None:
    target = base / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def add_process(
    base: Path,
    pid: int,
    ppid: int,
    argv: list[str],
    env: dict[str, str] | None = None,
    maps: str = TORCH_MAPS,
    nspid: tuple[int, ...] | None = None,
    threads: dict[int, tuple[int, ...]] | None = None,
    uid: int = 0,
) -> None:
    """A process as /proc shows it (fs/proc/array.c's formats), with its threads:
    tid -> its NSpid ids."""
    name = Path(argv[0]).name[:15]
    stat = f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1 4194304 1 0 0 0 250 50 0 0 20 0 1 0"
    write(base, f"/proc/{pid}/stat", stat + "\n")
    ns = "\t".join(str(i) for i in (nspid or (pid,)))
    status = (
        f"Name:\t{name}\nState:\tS (sleeping)\nPPid:\t{ppid}\nTracerPid:\t0\n"
        f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{ns}\nThreads:\t1\n"
        "CapEff:\t000001ffffffffff\n"
    )
    write(base, f"/proc/{pid}/status", status)
    write(base, f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")
    write(base, f"/proc/{pid}/comm", name + "\n")
    write(base, f"/proc/{pid}/environ", "".join(f"{k}={v}\0" for k, v in (env or {}).items()))
    write(base, f"/proc/{pid}/maps", maps)
    for tid, tns in (threads or {pid: nspid or (pid,)}).items():
        tabs = "\t".join(str(i) for i in tns)
        write(base, f"/proc/{pid}/task/{tid}/status", f"Name:\t{name}\nNSpid:\t{tabs}\n")


# ---------------------------------------------------------------- PID 1 and the job


def test_pid_1_that_is_python_with_torch_is_the_job(tmp_path):
    add_process(tmp_path, 1, 0, ["python", "train.py"], nspid=(1,))
    job = find(1, root=SysRoot(tmp_path))
    assert [r.pid for r in job.ranks] == [1] and job.agent is None


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["/sbin/init", "splash"], "an init process"),
        (["/lib/systemd/systemd", "--system"], "an init process"),
        (["/bin/sh", "-c", "python train.py"], "a shell"),
        (["/usr/bin/sleep", "infinity"], "not a Python process"),
    ],
)
def test_pid_1_that_is_not_python_is_refused_in_one_line_saying_what_it_is(tmp_path, argv, what):
    add_process(tmp_path, 1, 0, argv, maps=PLAIN_MAPS)
    add_process(tmp_path, 7, 1, ["python", "train.py"])
    with pytest.raises(UsageError) as e:
        find(1, root=SysRoot(tmp_path))
    line = str(e.value)
    assert "\n" not in line and what in line and line.startswith("PID 1 (")
    assert "PID 7 (python train.py)" in line  # where the training process is


def test_no_process_id_below_1(tmp_path):
    with pytest.raises(UsageError, match="not a process id"):
        find(0, root=SysRoot(tmp_path))


# ---------------------------------------------------------------- ranks and workers


def torchrun_tree(base: Path) -> None:
    """torchrun (100) -> ranks 101 (RANK 0) and 102 (RANK 1), each with a DataLoader
    worker carrying the same RANK (201, 202), and one worker's own child (301)."""
    add_process(base, 100, 1, ["/venv/bin/python", "/venv/bin/torchrun", "train.py"])
    for rank, pid in ((0, 101), (1, 102)):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank)}
        add_process(base, pid, 100, ["/venv/bin/python", "train.py"], env)
        add_process(base, pid + 100, pid, ["/venv/bin/python", "train.py"], env)
    add_process(base, 301, 201, ["/venv/bin/python", "-c", "x"], {"RANK": "0"})


def test_a_torchrun_agent_has_its_ranks_not_their_workers(tmp_path):
    torchrun_tree(tmp_path)
    job = find(100, root=SysRoot(tmp_path))
    assert [(r.pid, r.rank) for r in job.ranks] == [(101, 0), (102, 1)]
    assert job.agent is not None and job.agent.pid == 100
    assert job.children[101] == (201, 301) and job.children[102] == (202,)


def test_all_ranks_from_one_rank_or_from_its_worker(tmp_path):
    torchrun_tree(tmp_path)
    for pid in (102, 202):
        job = find(pid, all_ranks=True, root=SysRoot(tmp_path))
        assert [r.pid for r in job.ranks] == [101, 102], pid
    with pytest.raises(UsageError, match="worker of rank 1 \\(PID 102\\): attach 102"):
        find(202, root=SysRoot(tmp_path))


def test_the_rank_rule_is_only_those_under_no_other():
    parents = {101: 100, 102: 100, 201: 101, 202: 102, 301: 201, 400: 1}
    candidates = {101: 0, 102: 1, 201: 0, 202: 1, 301: 0, 400: 5}
    assert ranks_of(candidates, parents) == {101: 0, 102: 1, 400: 5}
    assert process.outermost({1, 2}, {1: 2, 2: 1}) == set()  # a loop: bounded, no hang


# ---------------------------------------------------------------- ids across namespaces


def test_nspid_is_read_outermost_first():
    s = process.parse_status("Name:\tpython\nPPid:\t0\nNSpid:\t4984\t17\t1\nUid:\t0\t5\t0\t0\n")
    assert s.nspid == (4984, 17, 1) and s.inner_pid == 1 and s.ppid == 0
    assert s.uid == 0 and s.euid == 5
    assert process.parse_status("NSpid:\t12\n").inner_pid == 12
    assert process.parse_status("NSpid:\t12 x\n").inner_pid is None


def test_threads_named_by_the_containers_ids_are_mapped_to_ours(tmp_path):
    # A container's PID 1 seen from the node as 4984, its threads 4985 and 4990: py-spy
    # names the process 4984 and its threads 1, 2 and 7.
    threads = {4984: (4984, 1), 4985: (4985, 2), 4990: (4990, 7)}
    add_process(tmp_path, 4984, 4982, ["python", "train.py"], nspid=(4984, 1), threads=threads)
    root = SysRoot(tmp_path)
    assert process.thread_ids(root, 4984) == {1: 4984, 2: 4985, 7: 4990}
    raw = (
        'process 4984:"python train.py";thread (1): MainThread;step (train.py:9) 40\n'
        'process 4984:"python train.py";thread (2): pin;run (threading.py:1) 10\n'
        'process 4984:"python train.py";thread (9): gone;run (threading.py:1) 3\n'
    )
    job = find(4984, root=root)
    assert job.ranks[0].ns_pid == 1
    stacks = ids.in_our_ids(parse_raw(raw), job.ranks[0], root)
    assert stacks.count((4984, 4984)) == 40 and stacks.count((4984, 4985)) == 10
    assert stacks.count((4984, 9)) == 3  # not in the map: left as it was
    assert stacks.thread_names[(4984, 4984)] == "MainThread"


def test_the_main_thread_is_mapped_even_where_the_process_has_gone(tmp_path):
    stacks = parse_raw('process 50:"python";thread (1): MainThread;f (a.py:1) 5\n')
    got = ids.in_our_ids(stacks, Process(50, "python", None, 1), SysRoot(tmp_path))
    assert got.count((50, 50)) == 5


def test_in_one_namespace_nothing_changes(tmp_path):
    add_process(tmp_path, 50, 1, ["python"], threads={50: (50,), 51: (51,)})
    stacks = parse_raw('process 50:"python";thread (50): MainThread;f (a.py:1) 5\n')
    got = ids.in_our_ids(stacks, find(50, root=SysRoot(tmp_path)).ranks[0], SysRoot(tmp_path))
    assert (
        got.by_thread
        == parse_raw('process 50:"python";thread (50): MainThread;f (a.py:1) 5\n').by_thread
    )


def test_ids_map_is_identity_for_unknown_threads():
    assert process.id_map({1: 100}, (100, 1)) == (100, 100)
    assert process.id_map({}, (100, 3)) == (100, 3)
    assert ids.renumber(Stacks(), {}).by_thread == {}


# ---------------------------------------------------------------- cgroup throttling


def mountinfo(*lines: str) -> str:
    return "".join(
        f"{30 + i} 1 0:{20 + i} {line}\n"
        for i, line in enumerate(("/ / rw - ext4 /dev/sda1 rw", *lines))
    )


def v1_node(base: Path) -> None:
    """A v1 node: the job (PID 500) in a pod whose quota (2 CPUs) sits above its
    container's (none); the pod throttled in 182 of 184 periods."""
    write(base, "/proc/self/mountinfo", mountinfo(
        "/ /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct",
        "/ /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory",
    ))  # fmt: skip
    write(base, "/proc/self/cgroup", "4:memory:/\n2:cpu,cpuacct:/\n")
    write(
        base, "/proc/500/cgroup", "4:memory:/kubepods/pod1/ctr\n2:cpu,cpuacct:/kubepods/pod1/ctr\n"
    )
    cpu = "/sys/fs/cgroup/cpu,cpuacct"
    for d, quota in ((cpu, -1), (f"{cpu}/kubepods", -1), (f"{cpu}/kubepods/pod1", 200000),
                     (f"{cpu}/kubepods/pod1/ctr", -1)):  # fmt: skip
        write(base, f"{d}/cpu.cfs_quota_us", f"{quota}\n")
        write(base, f"{d}/cpu.cfs_period_us", "100000\n")
        write(base, f"{d}/cpu.stat", "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    write(base, f"{cpu}/kubepods/pod1/cpu.stat",
          "nr_periods 184\nnr_throttled 182\nthrottled_time 9100000000\n")  # fmt: skip


def v2_node(base: Path, hybrid: bool = False) -> None:
    lines = ["/ /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate"]
    write(base, "/proc/500/cgroup", "0::/kubepods.slice/pod1.slice/ctr.scope\n")
    if hybrid:  # v1 controllers, but not cpu: the cpu figures come from v2's tree
        lines.append("/ /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory")
        write(base, "/proc/500/cgroup", "4:memory:/x\n0::/kubepods.slice/pod1.slice/ctr.scope\n")
    write(base, "/proc/self/mountinfo", mountinfo(*lines))
    top = "/sys/fs/cgroup/kubepods.slice"
    for d, limit in ((top, "max 100000"), (f"{top}/pod1.slice", "150000 100000"),
                     (f"{top}/pod1.slice/ctr.scope", "max 100000")):  # fmt: skip
        write(base, f"{d}/cpu.max", limit + "\n")
        write(base, f"{d}/cpu.stat", "usage_usec 5\nnr_periods 0\nnr_throttled 0\n")
    write(base, f"{top}/pod1.slice/cpu.stat",
          "usage_usec 9\nnr_periods 50\nnr_throttled 20\nthrottled_usec 1500000\n")  # fmt: skip


def test_v1_throttling_is_read_where_the_pods_quota_is(tmp_path, monkeypatch):
    v1_node(tmp_path)
    root = SysRoot(tmp_path)
    where = cgroup_dir(500, root)
    assert where == "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1"
    t = cgroup.throttling_of(root, 500).value
    assert t is not None and (t.nr_periods, t.nr_throttled) == (184, 182)
    assert t.throttled_s == pytest.approx(9.1)
    monkeypatch.setenv("STARVECHECK_SYSROOT", str(tmp_path))
    assert _cpu_stat(where) == {"nr_periods": 184.0, "nr_throttled": 182.0, "throttled_s": 9.1}


@pytest.mark.parametrize("hybrid", [False, True])
def test_v2_and_hybrid_throttling(tmp_path, monkeypatch, hybrid):
    v2_node(tmp_path, hybrid)
    root = SysRoot(tmp_path)
    where = cgroup_dir(500, root)
    assert where == "/sys/fs/cgroup/kubepods.slice/pod1.slice"
    monkeypatch.setenv("STARVECHECK_SYSROOT", str(tmp_path))
    assert _cpu_stat(where) == {"nr_periods": 50.0, "nr_throttled": 20.0, "throttled_s": 1.5}


def test_no_quota_anywhere_is_the_processs_own_cgroup_and_none_is_unknown(tmp_path):
    v2_node(tmp_path)
    top = tmp_path / "sys/fs/cgroup/kubepods.slice"
    (top / "pod1.slice/cpu.max").write_text("max 100000\n")
    assert (
        cgroup_dir(500, SysRoot(tmp_path)) == "/sys/fs/cgroup/kubepods.slice/pod1.slice/ctr.scope"
    )
    assert cgroup_dir(501, SysRoot(tmp_path)) is None  # no such process
    assert cgroup.throttling_of(SysRoot(tmp_path), 501).reason


# ---------------------------------------------------------------- ptrace refused


def facts(scope, ours, job, cap):
    return process.PtraceFacts(scope, ours, job, cap)


def test_what_is_missing_to_read_the_job_is_named_with_the_grant():
    other = process.ptrace_missing(facts(1, 1001, 65534, False), 7)
    assert "uid 65534" in other and "uid 1001" in other and "SYS_PTRACE" in other
    assert "as uid 65534 with kernel.yama.ptrace_scope 0 or" in other
    no_yama = process.ptrace_missing(facts(None, 1001, 65534, False), 7)
    assert "as uid 65534 or grant" in no_yama
    assert 'securityContext.capabilities.add: ["SYS_PTRACE"]' in other
    assert "--cap-add SYS_PTRACE" in other
    scope1 = process.ptrace_missing(facts(1, 0, 0, False), 7)
    assert "kernel.yama.ptrace_scope is 1" in scope1 and "--cap-add SYS_PTRACE" in scope1
    assert "ptrace_scope is 3" in process.ptrace_missing(facts(3, 0, 0, True), 7)
    assert "ptrace_scope is 2" in process.ptrace_missing(facts(2, 0, 0, False), 7)
    assert "seccomp" in process.ptrace_missing(facts(None, 0, 0, True), 7)


def test_the_facts_come_from_the_machine(tmp_path):
    add_process(tmp_path, 7, 1, ["python"], uid=65534)
    write(
        tmp_path, "/proc/self/status", "Uid:\t1001\t1001\t1001\t1001\nCapEff:\t0000000000000000\n"
    )
    write(tmp_path, "/proc/sys/kernel/yama/ptrace_scope", "1\n")
    assert process.ptrace_facts(SysRoot(tmp_path), 7) == facts(1, 1001, 65534, False)
    write(tmp_path, "/proc/self/status", "Uid:\t0\t0\t0\t0\nCapEff:\t00000000a80425fb\n")
    assert process.ptrace_facts(SysRoot(tmp_path), 7).have_cap is False  # docker's default
    write(tmp_path, "/proc/self/status", "Uid:\t0\t0\t0\t0\nCapEff:\t00000000a80c25fb\n")
    assert process.ptrace_facts(SysRoot(tmp_path), 7).have_cap is True  # --cap-add SYS_PTRACE


def test_py_spys_refusal_is_its_own_words_never_a_backtrace_line():
    err = (
        "Error: Failed to attach: Operation not permitted (os error 1)\n"
        "stack backtrace:\n   0: py_spy::main\n   7: main\npy-spy: 7: main\n"
    )
    assert _why(err) == "Error: Failed to attach: Operation not permitted (os error 1)"
    assert (
        _last("stack backtrace:\n  7: main\npy-spy: 7: main\n") == "py-spy failed with no message"
    )
    assert _last("thread 'main' panicked\nsomething broke\n   7: main\n") == "something broke"


# ---------------------------------------------------------------- parsers


def test_stat_parser_counts_after_the_last_parenthesis():
    text = "42 (a) b) (c) R 7 42 42 0 -1 0 0 0 0 0 300 100 0 0 20 0 3 0 55\n"
    s = process.parse_stat(text)
    assert s is not None and s.state == "R" and s.ppid == 7
    assert s.cpu_s == pytest.approx(400 * process.TICK_S)
    assert process.parse_stat("42 (x) R 7") is None


def test_uss_io_environ_cmdline():
    rollup = "Rss:  100 kB\nPrivate_Clean:  8 kB\nPrivate_Dirty:  4 kB\n"
    assert process.parse_uss(rollup) == 12 * 1024
    assert process.parse_uss("Rss: 1 kB\n") is None
    assert process.parse_io("rchar: 10\nread_bytes: 4096\nbad: x\n") == {
        "rchar": 10,
        "read_bytes": 4096,
    }
    assert process.parse_environ("RANK=1\0A=b=c\0junk\0") == {"RANK": "1", "A": "b=c"}
    assert process.parse_cmdline("python\0train.py\0\0") == ["python", "train.py"]


@given(st.text(max_size=400))
def test_parsers_never_raise_on_garbage(text):
    s = process.parse_stat(text)
    assert s is None or (len(s.state) == 1 and s.ppid >= 0 and s.cpu_s >= 0)
    st_ = process.parse_status(text)
    assert all(i >= 0 for i in st_.nspid)
    assert process.parse_uss(text) is None or process.parse_uss(text) >= 0
    assert all(v >= 0 for v in process.parse_io(text).values())
    process.parse_environ(text), process.parse_cmdline(text), process.parse_scope(text)


@given(st.lists(st.sampled_from(["Name:", "State:", "PPid:", "NSpid:", "Uid:", "CapEff:",
                                 "\t", " ", "1", "12", "-3", "ff", "x", "\n", "0x1f"]),
                max_size=60))  # fmt: skip
def test_status_parser_against_near_miss_text(words):
    s = process.parse_status("".join(words))
    assert s.cap_eff is None or s.cap_eff >= 0
    assert s.ppid is None or s.ppid >= 0


def test_whether_the_kernel_allows_reading_the_job():
    assert process.ptrace_allowed(facts(None, 0, 0, True)) is True
    assert process.ptrace_allowed(facts(3, 0, 0, True)) is False
    assert process.ptrace_allowed(facts(None, 1001, 65534, False)) is False
    assert process.ptrace_allowed(facts(1, 1001, 1001, False)) is False
    assert process.ptrace_allowed(facts(0, 1001, 1001, False)) is True
    assert process.ptrace_allowed(facts(None, 1001, None, None)) is None
