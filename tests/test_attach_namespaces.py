"""attach where jobs really run, with real kernels' walls rather than fakes: a
data-starved loop (tests/loops/attach_loop.py) as PID 1 of its own PID namespace, as a
container runs it, read from inside (attach 1) and from the node (its host PID); the
loop run as one unprivileged user and attach as another, which may not read its
stacks; the loop in a cgroup v1 CPU quota. Each skips, with the reason, where this
machine does not allow it (not root, no unshare, no v1 cpu hierarchy)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.loops.attachjob import as_user, shared_dir
from tests.loops.attachjob import env as _env
from tests.loops.loopstate import attach_beside, data_share, own_share, stop_tree

LOOP = Path(__file__).parent / "loops" / "attach_loop.py"
SECONDS = 10  # attach's default: within about 0.03 of the loop's own share (test_attach.py)
NOBODY, OTHER = 65534, 65533


def _can(cmd: list[str]) -> str | None:
    """None where `cmd` runs; else why not (the skip's reason)."""
    if os.geteuid() != 0:
        return "needs root (namespaces, another user)"
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]} is not installed"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    return None if r.returncode == 0 else f"{' '.join(cmd)} is not permitted: {r.stderr.strip()}"


def _wait_state(p: subprocess.Popen[Any], path: Path) -> None:
    deadline = time.time() + 90
    while not path.exists():
        assert p.poll() is None, "the loop exited"
        assert time.time() < deadline, "the loop never started"
        time.sleep(0.1)
    time.sleep(1.5)  # past its first batches


def _stage(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)["stages"][0]


def _findings(stage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["id"]: f for f in stage["findings"]}


@pytest.fixture(scope="module")
def namespaced(tmp_path_factory) -> Iterator[tuple[int, Path]]:
    """The data loop as PID 1 of a new PID namespace: (its PID here, its state file)."""
    why = _can(["unshare", "--pid", "--fork", "--mount-proc", "true"]) or _can(
        ["nsenter", "--version"]
    )
    if why:
        pytest.skip(why)
    path = tmp_path_factory.mktemp("ns") / "state.json"
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(LOOP), "data",
           str(path)]  # fmt: skip
    p = subprocess.Popen(cmd, start_new_session=True)
    try:
        _wait_state(p, path)
        (inner,) = psutil.Process(p.pid).children()
        with open(f"/proc/{inner.pid}/status") as f:
            assert f"NSpid:\t{inner.pid}\t1\n" in f.read()  # PID 1 in there
        yield inner.pid, path
    finally:
        stop_tree(p)  # SIGKILL: a namespace's PID 1 ignores SIGTERM


def _read(cmd: list[str], path: Path, pid_in_json: int) -> tuple[dict[str, Any], float, float]:
    r, (a,), (b,) = attach_beside(cmd, [path], timeout=180)
    stage = _stage(r)
    return stage, data_share(stage, pid_in_json), own_share(a, b)


def _inside(host_pid: int) -> list[str]:
    """attach 1, started inside the namespace."""
    inside = [sys.executable, "-m", "starvecheck", "attach", "1", "--json", "-",
              "--duration", str(SECONDS)]  # fmt: skip
    # nsenter --mount starts it in the namespace's root directory: the sources by their
    # absolute path
    where = f"PYTHONPATH={_env()['PYTHONPATH']}"
    return ["nsenter", "--target", str(host_pid), "--pid", "--mount", "--", "env", where, *inside]


def _from_the_node(host_pid: int) -> list[str]:
    """attach HOST_PID, started on the node."""
    return [sys.executable, "-m", "starvecheck", "attach", str(host_pid), "--json", "-",
            "--duration", str(SECONDS)]  # fmt: skip


# The slow lane checks what holds on a loaded machine (the job found, its data wait
# reported under the PID attach was given, the verdict of a loop that waits for data
# about three quarters of its time); the sampled share against the loop's own clock is
# a sampler's accuracy, checked in the accuracy lane (the last test of this group).


@pytest.mark.slow
def test_pid_1_of_a_pid_namespace_read_from_inside(namespaced):
    host_pid, path = namespaced
    stage, share, _ = _read(_inside(host_pid), path, 1)
    assert stage["parameters"]["ranks"][0]["pid"] == 1
    assert share > 0, stage["metrics"]  # main_share labelled with PID 1 (0.0: none)
    f = _findings(stage)["attach.data-wait"]
    assert f["severity"] in ("warning", "critical"), f


@pytest.mark.slow
def test_pid_1_of_a_pid_namespace_read_from_the_node(namespaced):
    host_pid, path = namespaced
    stage, share, _ = _read(_from_the_node(host_pid), path, host_pid)
    samples = [m for m in stage["metrics"] if m["labels"].get("quantity") == "samples"]
    assert samples and samples[0]["value"] > 100, samples  # the main thread was found
    assert share > 0, stage["metrics"]  # main_share labelled with the host PID (0.0: none)
    f = _findings(stage)["attach.data-wait"]
    assert f["severity"] in ("warning", "critical"), f


@pytest.mark.accuracy
@pytest.mark.parametrize("where", ["inside", "node"])
def test_pid_1_of_a_pid_namespace_is_read_at_the_loops_own_share(namespaced, where):
    """The share attach samples, from inside the namespace and from the node, within
    0.05 of the loop's own clock over the same seconds: a truth check of the sampler,
    which needs a quiet machine (moved from the two slow tests above)."""
    host_pid, path = namespaced
    cmd, pid = (_inside(host_pid), 1) if where == "inside" else (_from_the_node(host_pid), host_pid)
    _, share, own = _read(cmd, path, pid)
    assert abs(share - own) <= 0.05, (share, own)


@pytest.mark.slow
def test_another_users_job_is_one_caveat_naming_the_grant_and_no_verdict():
    why = _can(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "true"])
    if why:
        pytest.skip(why)
    # Both users run this checkout's Python and sources: in a checkout under a directory
    # other users may not enter (mode 0700, as root's home and CI's clone are) they
    # cannot, and no mode of a directory this test did not make is changed to let them.
    for uid in (NOBODY, OTHER):
        r = subprocess.run(as_user(uid, [sys.executable, "-c", "import starvecheck, torch"]),
                           capture_output=True, text=True, timeout=120, env=_env(),
                           cwd="/")  # fmt: skip
        if r.returncode != 0:
            pytest.skip(
                f"uid {uid} cannot run {sys.executable} with this checkout's sources (a "
                "directory above them is closed to other users): run from a checkout "
                "others may read"
            )
    with shared_dir() as d:
        path = d / "state.json"
        env = _env(HOME=str(d), TMPDIR=str(d))
        loop = subprocess.Popen(as_user(NOBODY, [sys.executable, str(LOOP), "data", str(path)]),
                                env=env, start_new_session=True)  # fmt: skip
        try:
            _wait_state(loop, path)
            job_pid = loop.pid  # setpriv execs the loop: the same process
            assert psutil.Process(job_pid).uids().real == NOBODY
            cmd = [sys.executable, "-m", "starvecheck", "attach", str(job_pid), "--json", "-",
                   "--duration", "3"]  # fmt: skip
            r = subprocess.run(as_user(OTHER, cmd), capture_output=True, text=True, timeout=180,
                               env=env, cwd=d)  # fmt: skip
            assert loop.poll() is None, "the loop died under attach"
        finally:
            stop_tree(loop)
    assert r.returncode in (0, 1), (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    stage = json.loads(r.stdout)["stages"][0]
    refused = [c for c in stage["caveats"] if "not sampled" in c]
    assert len(refused) == 1, stage["caveats"]
    said = refused[0]
    assert f"uid {NOBODY}" in said and f"uid {OTHER}" in said, said
    assert 'securityContext.capabilities.add: ["SYS_PTRACE"]' in said, said
    assert "--cap-add SYS_PTRACE" in said, said
    assert ": main" not in said  # never a backtrace's line
    assert "attach.data-wait" not in _findings(stage)  # no verdict without its stacks
    quantities = {m["labels"].get("quantity") for m in stage["metrics"]}
    assert "main_cpus" in quantities and "main_share" not in quantities


V1_CPU = Path("/sys/fs/cgroup/cpu")


@pytest.mark.slow
def test_a_cgroup_v1_cpu_quota_is_read_as_throttling(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (a cgroup of its own)")
    if not (V1_CPU / "cpu.cfs_quota_us").is_file():
        pytest.skip("no cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu on this machine")
    group = V1_CPU / f"starvecheck-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"cannot make a v1 cpu cgroup: {e}")
    path = tmp_path / "state.json"
    try:
        (group / "cpu.cfs_quota_us").write_text("20000\n")  # 0.2 CPU: throttled most periods
        cmd = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"', sys.executable,
               str(LOOP), "data", str(path)]  # fmt: skip
        loop = subprocess.Popen(cmd, start_new_session=True)
        try:
            _wait_state(loop, path)
            r = subprocess.run(
                [sys.executable, "-m", "starvecheck", "attach", str(loop.pid), "--json", "-",
                 "--duration", "4"],
                capture_output=True, text=True, timeout=180, env=_env(),
            )  # fmt: skip
        finally:
            stop_tree(loop)
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                group.rmdir()
            if not group.exists():
                break
            time.sleep(0.1)
    stage = _stage(r)
    got = {m["labels"].get("quantity"): m["value"] for m in stage["metrics"]}
    assert got.get("nr_periods", 0) > 10 and got["nr_throttled"] / got["nr_periods"] > 0.5, got
    assert "attach.throttled" in _findings(stage)


RANKS_WITH_WORKERS = """
import os, sys, time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.zeros(4)

torch.set_num_threads(1)
dist.init_process_group("gloo")
it = iter(DataLoader(Slow(), batch_size=2, num_workers=1))
next(it)
open(sys.argv[1] + "." + os.environ["RANK"], "w").close()
while True:
    next(it)
    dist.all_reduce(torch.ones(1))
"""


@pytest.mark.slow
def test_a_torchrun_jobs_ranks_are_not_their_dataloader_workers(tmp_path):
    # Each rank's worker carries RANK too: two ranks, one worker each, are two ranks.
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_WITH_WORKERS)
    ready = tmp_path / "ready"
    port = str(29700 + os.getpid() % 1000)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", port, str(script), str(ready)]  # fmt: skip
    agent = subprocess.Popen(cmd, env=_env(OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        for rank in (0, 1):
            _wait_state(agent, Path(f"{ready}.{rank}"))
        ranks = {c.pid for c in psutil.Process(agent.pid).children()}
        r = subprocess.run(
            [sys.executable, "-m", "starvecheck", "attach", str(agent.pid), "--json", "-",
             "--duration", "3"],
            capture_output=True, text=True, timeout=180, env=_env(),
        )  # fmt: skip
        worker = next(iter(psutil.Process(min(ranks)).children()))
        r_all = subprocess.run(
            [sys.executable, "-m", "starvecheck", "attach", str(worker.pid), "--all",
             "--json", "-", "--duration", "2"],
            capture_output=True, text=True, timeout=180, env=_env(),
        )  # fmt: skip
    finally:
        stop_tree(agent)
    for run in (r, r_all):
        found = _stage(run)["parameters"]["ranks"]
        assert {x["pid"] for x in found} == ranks, (found, ranks)
        assert sorted(x["rank"] for x in found) == [0, 1]
