"""The DataLoader workers `loader --factory` starts: they die with the main process
whatever the moment, start under spawn and forkserver, are fitted to the machine's
limits before they start, and a worker the kernel killed for memory is named so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from starvecheck.core.status import UsageError
from starvecheck.inputs.factory import parse_spec
from starvecheck.stages.loader.factory import configuration as pipeline
from starvecheck.stages.loader.factory import load as factory
from starvecheck.stages.loader.factory import stage as ownloader
from tests.conftest import alive, children
from tests.pidscgroup import pids_cgroup, remove

FACTORY = textwrap.dedent(
    """
    import os, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Small(Dataset):
        def __init__(self, n=256):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return torch.full((8,), i, dtype=torch.int64)

    def slow_init(worker_id):
        open(os.path.join(os.environ["MARKS"], str(os.getpid())), "w").close()
        time.sleep(60)

    def slow():
        return DataLoader(Small(), batch_size=8, num_workers=2, worker_init_fn=slow_init)

    def slow_forkserver():
        return DataLoader(Small(), batch_size=8, num_workers=2, worker_init_fn=slow_init,
                          multiprocessing_context="forkserver")

    def seen(worker_id):
        os.environ["SEEN_BY_WORKER"] = str(worker_id)

    def spawn():
        return DataLoader(Small(), batch_size=8, num_workers=1, worker_init_fn=seen,
                          multiprocessing_context="spawn")

    def forkserver():
        return DataLoader(Small(), batch_size=8, num_workers=1,
                          multiprocessing_context="forkserver")

    def two():
        return DataLoader(Small(), batch_size=8, num_workers=2)

    def dataset():
        return Small()

    class Big(Small):
        def __getitem__(self, i):
            return torch.zeros(512 * 1024, dtype=torch.float64)  # 4 MiB

    def big():
        return DataLoader(Big(64), batch_size=1)

    class Starts(Small):
        started = False
        def __getitem__(self, i):
            import subprocess
            if not self.started and torch.utils.data.get_worker_info() is not None:
                self.started = True
                p = subprocess.Popen(["sleep", "60"], start_new_session=True)
                open(os.path.join(os.environ["MARKS"], str(p.pid)), "w").close()
            return super().__getitem__(i)

    def starts():
        return DataLoader(Starts(), batch_size=8, num_workers=1)

    class Oom(Small):
        def __getitem__(self, i):
            if i == 40 and torch.utils.data.get_worker_info() is not None:
                with open(os.environ["OOM_EVENTS"], "w") as f:
                    f.write("low 0\\nhigh 0\\nmax 3\\noom 1\\noom_kill 1\\n")
                os.kill(os.getpid(), 9)
            return super().__getitem__(i)

    def oom():
        return DataLoader(Oom(), batch_size=4, sampler=range(256), num_workers=1)
    """
)


@pytest.fixture
def factory_file(tmp_path: Path) -> Path:
    # A name no other test module uses: the file is imported by its own stem.
    path = tmp_path / "workers_factory.py"
    path.write_text(FACTORY)
    return path


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


# --- workers die with the main process ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("func", ["slow", "slow_forkserver"])
def test_workers_in_a_slow_worker_init_fn_die_with_a_killed_main_process(
    factory_file: Path, tmp_path: Path, func: str
) -> None:
    """SIGKILL (or the OOM killer) on the main process while its workers are in the
    user's worker_init_fn: torch's watchdog is not running yet, and the workers (and
    multiprocessing's resource tracker with them) used to wait for good."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "loader", "--factory", f"{factory_file}:{func}",
         "--workers", "2", "--budget", "5", "--json", "-"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        # Its own TMPDIR: a run killed with SIGKILL leaves its recorded pymp-* and
        # marker directory there (what `clean` removes), not in the shared /tmp.
        env={**os.environ, "MARKS": str(marks), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            seen |= descendants(proc.pid)
            time.sleep(0.05)
        assert len(list(marks.iterdir())) == 2, "the workers never reached worker_init_fn"
        seen |= descendants(proc.pid)
        in_init = {int(p.name) for p in marks.iterdir()}
        assert in_init <= seen
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 5
        while [p for p in seen if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.05)
        left = {p: _cmdline(p) for p in seen if alive(p)}
        assert not left, f"left running after the main process was killed: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in seen:
            if alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_while_workers_are_in_a_slow_worker_init_fn_ends_at_once(
    factory_file: Path, tmp_path: Path
) -> None:
    """torch's shutdown gave each worker still in worker_init_fn 5 s to leave, then
    another 5 s after SIGTERM (which workers ignore): 20 s for two workers."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "loader", "--factory", f"{factory_file}:slow",
         "--workers", "2", "--budget", "5", "--json", "-"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "MARKS": str(marks), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)
        workers = descendants(proc.pid)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143 and err.count("\n") == 1, err
    assert took < 8, f"{took:.1f} s from SIGTERM to exit"
    assert not [p for p in workers if alive(p)]


# --- spawn, forkserver and multiprocessing_context -------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("func", ["spawn", "forkserver"])
def test_a_factory_file_with_spawn_or_forkserver_workers_is_measured(
    factory_file: Path, func: str
) -> None:
    """Workers started by spawn or forkserver import FILE.py by its name to unpickle
    its dataset; num_workers=0 is read without the multiprocessing_context DataLoader
    refuses there, and a caveat says so."""
    p = factory.load(parse_spec(f"{factory_file}:{func}"), None, limit_s=60)
    budget = pipeline.Budget(1.0, 60.0)
    runs = [("workers", pipeline.measure(p, pipeline.Config(w), budget)) for w in (0, 1)]
    for _, run in runs:
        assert run.batches > 0 and run.samples_per_s, run.config
    plan = ownloader.Plan(
        spec=p.spec, batch_size=None, workers=(0, 1), quick=True, effective_cpus=2,
        budget_s=1.0, batch_timeout_s=60.0,
    )  # fmt: skip
    caveats = {c.id: str(c) for c in ownloader.result(p, plan, runs).caveats}
    assert f"without the pipeline's multiprocessing_context ({func})" in caveats.get(
        "loader.context-at-0", ""
    )


@pytest.mark.slow
def test_the_command_measures_a_spawn_pipeline(factory_file: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "starvecheck", "loader", "--factory", f"{factory_file}:spawn",
         "--workers", "0,1", "--quick", "--budget", "0.5", "--json", "-"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "exited unexpectedly" not in r.stderr
    stage = json.loads(r.stdout)["stages"][0]
    measured = {c["workers"] for c in stage["parameters"]["configurations"] if c["batches"]}
    assert measured == {0, 1}
    assert stage["parameters"]["start_method"] == "spawn"


def test_a_file_spawn_workers_cannot_import_by_name_is_one_line(
    factory_file: Path, tmp_path: Path
) -> None:
    """`my-pipe.py` is no module name: every spawn worker printed a traceback, and the
    run ended in "exited unexpectedly"."""
    hyphen = tmp_path / "my-pipe.py"
    hyphen.write_text(factory_file.read_text())
    r = subprocess.run(
        [sys.executable, "-m", "starvecheck", "loader", "--factory", f"{hyphen}:spawn",
         "--workers", "0,1", "--quick", "--budget", "0.5", "--json", "-"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.count("\n") == 1
    assert "workers started by spawn import my-pipe.py by its name" in r.stderr


# --- the machine's limits, checked before workers start -------------------------------------


def _limited(soft: int, hard: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _cli(spec: str, *args: str, limit: tuple[int, int] | None = None, **env: str):
    return subprocess.run(
        [sys.executable, "-m", "starvecheck", "loader", "--factory", spec, "--quick",
         "--budget", "0.5", *args, "--json", "-"],
        capture_output=True, text=True, timeout=120,
        preexec_fn=(lambda: _limited(*limit)) if limit else None,
        env={**os.environ, **env},
    )  # fmt: skip


def _measured(report: str) -> set[int]:
    stage = json.loads(report)["stages"][0]
    return {c["workers"] for c in stage["parameters"]["configurations"] if c["batches"]}


@pytest.mark.slow
def test_the_default_sweep_is_fitted_to_the_open_file_limit(factory_file: Path) -> None:
    """Without --workers there was no check: a 120 s wait and tracebacks under
    `ulimit -n 12`."""
    r = _cli(f"{factory_file}:two", limit=(12, 12))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.startswith("starvecheck: error: the open-file limit is 12")
    assert r.stderr.count("\n") == 1
    r = _cli(f"{factory_file}:two", limit=(72, 72))  # 80 files for 2 workers, 72 for 1
    assert r.returncode == 0, r.stderr[-3000:]
    assert "num_workers=2" in r.stderr and "was not measured" in r.stderr
    assert _measured(r.stdout) == {0, 1}


def _plan(spec: str, **kw: object) -> ownloader.Plan:
    base: dict = dict(
        spec=parse_spec(spec), batch_size=None, workers=None, quick=True, effective_cpus=2,
        budget_s=0.5, batch_timeout_s=60.0, rounds=1,
    )  # fmt: skip
    return ownloader.Plan(**{**base, **kw})


def test_worker_counts_whose_batches_do_not_fit_in_dev_shm_are_left_out(
    factory_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 MiB /dev/shm ended the whole run (SIGBUS, "exited unexpectedly")."""
    from starvecheck.stages.dataloader import preflight

    said: list[str] = []
    monkeypatch.setattr(preflight, "shm_free", lambda: 1 << 20)
    out = ownloader.run_factory(_plan(f"{factory_file}:two"), lambda *a: None, said.append)
    configs = out.parameters["configurations"]
    assert {c["workers"] for c in configs} == {0}  # the current num_workers=2 too
    assert any("/dev/shm has 1MiB free" in w or "/dev/shm has 1" in w for w in said), said
    # 40 MiB free, 4 MiB batches: one worker's two in flight fit (32 MiB with the
    # margin), two workers' do not (48 MiB): the batch is read once to know.
    said.clear()
    monkeypatch.setattr(preflight, "shm_free", lambda: 40 << 20)
    out = ownloader.run_factory(_plan(f"{factory_file}:big"), lambda *a: None, said.append)
    assert {c["workers"] for c in out.parameters["configurations"]} == {0, 1}
    assert len(said) == 1 and "num_workers=2" in said[0], said


def test_a_roomy_dev_shm_is_checked_from_one_sample_not_a_whole_batch(
    factory_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--quick at 100 ms a sample and batch 16 spent 1.6 s of its 30 reading one batch
    at num_workers=0 for /dev/shm's check, on a machine with gigabytes of it free."""
    from starvecheck.stages.dataloader import preflight
    from starvecheck.stages.loader.factory import fits
    from starvecheck.stages.loader.factory.loaders import Config

    p = factory.load(parse_spec(f"{factory_file}:two"), None, limit_s=60)
    assert fits.sample_bytes(p, 60.0) == fits.batch_bytes(p, 60.0) == 8 * 8 * 8
    big = factory.load(parse_spec(f"{factory_file}:big"), None, limit_s=60)
    assert fits.sample_bytes(big, 60.0) == 4 << 20
    read: list[object] = []
    monkeypatch.setattr(fits, "batch_bytes", lambda *a: read.append(a) or 512)
    said: list[str] = []
    monkeypatch.setattr(preflight, "shm_free", lambda: 1 << 40)
    assert fits.fit_run(p, (0, 1, 2), Config(2), 60.0, said.append) == ((0, 1, 2), True, False)
    assert read == [] and said == []
    # 16 times the sample's share does not fit two workers' batches in flight (16 MiB
    # and 64 KiB with the margin), the batch itself does (16 MiB and 4 KiB): it is read.
    monkeypatch.setattr(preflight, "shm_free", lambda: (16 << 20) + (32 << 10))
    assert fits.fit_run(p, (0, 1, 2), Config(2), 60.0, said.append) == ((0, 1, 2), True, False)
    assert len(read) == 1 and said == []


# --- how a worker died ----------------------------------------------------------------------


def test_a_worker_killed_for_memory_is_named_with_the_oom_count(
    factory_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker the OOM killer took read as "exited unexpectedly" or a
    ConnectionResetError, never as memory. A fake cgroup tree (STARVECHECK_SYSROOT)
    whose oom_kill the worker raises before it dies, as the kernel would."""
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("0::/job\n")
    (root / "proc/self/mountinfo").write_text(
        "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
    )
    events = root / "sys/fs/cgroup/job/memory.events"
    events.parent.mkdir(parents=True)
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    monkeypatch.setenv("STARVECHECK_SYSROOT", str(root))
    monkeypatch.setenv("OOM_EVENTS", str(events))
    p = factory.load(parse_spec(f"{factory_file}:oom"), None, limit_s=60)
    with pytest.raises(UsageError) as e:
        pipeline.measure(p, pipeline.Config(1), pipeline.Budget(5.0, 30.0))
    text = str(e.value)
    assert "killed for memory" in text, text
    assert "oom_kill in /sys/fs/cgroup/job/memory.events rose from 0 to 1" in text


# --- processes the pipeline left running ----------------------------------------------------


@pytest.mark.slow
def test_processes_the_users_workers_started_are_stopped(
    factory_file: Path, tmp_path: Path
) -> None:
    """A dataset that starts a process of its own in each worker: orphaned when the
    worker stopped, they ran on after the run (one case left 604)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    r = _cli(f"{factory_file}:starts", "--workers", "1", MARKS=str(marks))
    started = [int(p.name) for p in marks.iterdir()]
    try:
        assert r.returncode == 0, r.stderr[-3000:]
        assert started
        deadline = time.monotonic() + 5
        while [p for p in started if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in started if alive(p)], "processes left running"
        assert "left" in r.stderr and "stopped" in r.stderr
    finally:
        for p in started:
            if alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.slow
def test_a_pids_limit_leaves_out_the_counts_that_cannot_start(
    factory_file: Path, tmp_path: Path
) -> None:
    """Under a 12-task pids limit: worker tracebacks ("can't start new thread") and a
    run lost to "exited unexpectedly"."""
    cg = pids_cgroup(tmp_path, 12)
    if cg is None:
        pytest.skip("no writable pids cgroup here")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "starvecheck", "loader", "--factory", f"{factory_file}:dataset",
             "--workers", "0,4", "--quick", "--budget", "0.5", "--json", "-"],
            capture_output=True, text=True, timeout=120,
            preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())),
        )  # fmt: skip
    finally:
        remove(cg)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.splitlines() == [
        "starvecheck: warning: the cgroup's pids limit (pids.max) lets 10 more processes and "
        "threads start: num_workers=4 would need up to 16 and was not measured; raise the "
        "limit (docker --pids-limit, a Kubernetes pod's pid limit) to measure it"
    ] or ("num_workers=4 would need" in r.stderr and len(r.stderr.splitlines()) == 1), r.stderr
    assert _measured(r.stdout) == {0}
