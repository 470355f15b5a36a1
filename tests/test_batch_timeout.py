"""--batch-timeout: a DataLoader that delivers nothing (a `__getitem__` that blocks for
good, with num_workers=0 and with workers) ends in one line and exit 2 within the
limit and a margin, every worker stopped, no /tmp/pymp-* and no scratch data left; a
batch slower than nothing but within the limit is not cut off; the SIGALRM handler
and timer in place before are put back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from starvecheck.core.status import BatchTimeout
from starvecheck.stages.dataloader.batches import Batches
from tests.conftest import settled

LIMIT_S = 2.0
MARGIN_S = 15.0  # interpreter exit, the workers' shutdown, a busy 2-core machine
CAUSE = "(in I/O, a lock, or a collate that never returns)"
HINT = "raise --batch-timeout if a batch really takes this long"

# A command registered in the child only, so the error goes through the command line's
# one error path (cli.main): a Dataset whose every sample waits on an Event never set.
HELPER = r"""
import sys, threading, time
import torch
from starvecheck.cli.common import app
from starvecheck.cli.main import main
from starvecheck.stages.dataloader.batches import Batches
from starvecheck.stages.dataloader.workers import prepare_workers, worker_init

class Blocking(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        threading.Event().wait()

@app.command("blocking")
def blocking(workers: int, limit: float) -> None:
    if workers:
        prepare_workers()
    loader = torch.utils.data.DataLoader(
        Blocking(), batch_size=4, num_workers=workers,
        worker_init_fn=worker_init if workers else None,
    )
    print(time.time(), flush=True)
    with Batches(loader, limit, "test", "blocking") as batches:
        for _ in batches:
            pass

sys.exit(main(["blocking", *sys.argv[1:]]))
"""

# `starvecheck ARGS` with the loader's datasets made to block for good: in DataLoader
# workers only (BLOCK=worker) or wherever they are read (BLOCK=anywhere).
RUNNER = r"""
import os, sys, threading
import torch.utils.data
from starvecheck.cli.main import main
from starvecheck.stages.samples import datasets

original = {c: c.__getitem__ for c in (datasets.FileSamples, datasets.ShardSamples)}

def stuck(self, i):
    if os.environ["BLOCK"] == "anywhere" or torch.utils.data.get_worker_info() is not None:
        threading.Event().wait()
    return original[type(self)](self, i)

for cls in original:
    cls.__getitem__ = stuck
sys.exit(main(sys.argv[1:]))
"""


def _group(pgid: int) -> list[int]:
    """Processes of the group still running (zombies not counted)."""
    alive = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


def _shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def _start(argv: list[str], tmp: Path, **env: str) -> subprocess.Popen[str]:
    # TMPDIR: multiprocessing's pymp-* lands there, so what is left is this run's.
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
        env={**os.environ, "TMPDIR": str(tmp), "STARVECHECK_DEBUG": "", **env},
        start_new_session=True,  # its own process group: every worker is in it
    )


def _children_while_running(proc: subprocess.Popen[str], want: int) -> set[int]:
    """The child's own children (its DataLoader workers), once `want` of them run."""
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and len(seen) < want:
        try:
            seen |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    return seen


def _ended(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str, float]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still waiting after {timeout:.0f} s: the DataLoader was not given up on")
    return out, err, time.time()


def _left_behind(proc: subprocess.Popen[str], workers: set[int], tmp: Path) -> list[str]:
    problems = []
    deadline = time.monotonic() + 5
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive := _group(proc.pid):
        problems.append(f"processes of its group still run: {alive}")
    if alive := [pid for pid in workers if psutil.pid_exists(pid) and _running(pid)]:
        problems.append(f"workers still run: {alive}")
    # torchinductor_<user>: torch's per-user compile cache, kept by design.
    temp = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))
    if temp := [t for t in temp if t != "data"]:
        problems.append(f"left in TMPDIR: {temp}")
    return problems


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_that_blocks_for_good_ends_in_one_line_within_the_limit(
    tmp_path: Path, workers: int
) -> None:
    proc = _start([sys.executable, "-c", HELPER, str(workers), str(LIMIT_S)], tmp_path)
    seen = _children_while_running(proc, workers) if workers else set()
    out, err, ended = _ended(proc, 120)
    assert proc.returncode == 2, err
    first = "first batch"
    where = f"(blocking, num_workers={workers}) in 2 s"
    if workers:
        line = f"{where} (worker start-up included): a worker is stuck {CAUSE}"
    else:
        line = f"{where}: the main process is stuck loading it {CAUSE}"
    assert err.splitlines() == [
        f"starvecheck: error: test: no {first} from the DataLoader {line}; {HINT}"
    ]
    started = float(out.split()[0])
    assert ended - started < LIMIT_S + MARGIN_S
    assert len(seen) >= workers  # the workers were there while it waited
    assert _left_behind(proc, seen, tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("block", ["worker", "anywhere"])
def test_the_loader_command_gives_up_on_a_stuck_read(tmp_path: Path, block: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    argv = [sys.executable, "-c", RUNNER, "loader", "--quick", "--no-cold", "--samples", "200"]
    argv += ["--runs", "1", "--workers", "2", "--batch-timeout", str(LIMIT_S), str(data)]
    shm_before = _shm()
    proc = _start(argv, tmp_path, BLOCK=block)
    seen = _children_while_running(proc, 2) if block == "worker" else set()
    _, err, _ = _ended(proc, 180)
    assert proc.returncode == 2, err
    if block == "worker":  # the warm-up batches (num_workers=0) came; the workers' not
        line = (
            "(small_files, num_workers=2) in 2 s (worker start-up included): a worker is "
            f"stuck {CAUSE}"
        )
    else:  # the first warm-up batch, in the main process
        line = f"(small_files, num_workers=0) in 2 s: the main process is stuck loading it {CAUSE}"
    assert err.splitlines() == [
        f"starvecheck: error: loader: no first batch from the DataLoader {line}; {HINT}"
    ]
    assert list(data.iterdir()) == []  # the scratch directory is gone
    assert _left_behind(proc, seen, tmp_path) == []
    assert sorted(settled(lambda: _shm() - shm_before)) == []  # Streaming's shared memory, torch's


class Slow:
    """Every sample sleeps: a batch takes batch_size x `sample_s`."""

    def __init__(self, n: int, sample_s: float) -> None:
        self.n = n
        self.sample_s = sample_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.sample_s)
        return i


def _loader(dataset: object, workers: int, **more: object) -> object:
    import torch

    from starvecheck.stages.dataloader.workers import prepare_workers, worker_init

    if workers:
        prepare_workers()
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=4,
        num_workers=workers,
        worker_init_fn=worker_init if workers else None,
        **more,
    )


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_batch_within_the_limit_is_not_cut_off(workers: int) -> None:
    # 1.2 s a batch (a sleep: a busy machine does not stretch it), 6 s allowed: the
    # first batch's limit holds the workers' start-up too (fork, worker_init_fn), which a
    # loaded machine does stretch, so 5x the batch, not 2.5x (3 s). Six batches: at
    # num_workers=0 they take 7.2 s in all, past the limit, so one limit for the whole
    # loop instead of one per batch would still cut it off.
    loader = _loader(Slow(24, 0.3), workers)
    with Batches(loader, 6.0, "test", "slow") as batches:
        got = [b.tolist() for b in batches]
    assert sorted(i for b in got for i in b) == list(range(24))
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.slow
def test_starve_allows_its_own_simulated_work_on_top_of_the_limit(cli) -> None:
    # 16 samples x 75 ms of sleep: 1.2 s a batch in the main process, past the 0.5 s
    # limit; the simulated work is the point of the run, not a stuck loader.
    r = cli(
        "starve", "--sleep", "--sample-ms", "75", "--batch-size", "16", "--step-ms", "1",
        "--workers", "0", "--steps", "1", "--batch-timeout", "0.5", "--json", "-",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert r.json["stages"][0]["parameters"]["steps"] == 1


def test_the_previous_handler_comes_back_and_a_timer_already_running_is_left_alone() -> None:
    rang: list[int] = []

    def mine(signum: int, frame: object) -> None:
        rang.append(signum)

    previous = signal.signal(signal.SIGALRM, mine)
    try:
        with Batches(_loader(Slow(4, 0.0), 0), 5.0, "test", "slow") as batches:
            inside = signal.getsignal(signal.SIGALRM)
            list(batches)
        assert inside is not mine and signal.getsignal(signal.SIGALRM) is mine
        # Someone else's alarm is running: no watchdog (the handler stays theirs), and
        # their alarm still rings when it is due.
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with Batches(_loader(Slow(4, 0.0), 0), 5.0, "test", "slow") as batches:
            assert signal.getsignal(signal.SIGALRM) is mine
            list(batches)
        deadline = time.monotonic() + 5
        while not rang and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rang == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_zero_means_no_limit() -> None:
    handlers: list[object] = []

    class Watched(Slow):
        def __getitem__(self, i: int) -> int:
            handlers.append(signal.getsignal(signal.SIGALRM))
            return super().__getitem__(i)

    with Batches(_loader(Watched(4, 0.0), 0), 0, "test", "slow") as batches:
        list(batches)
    assert handlers and all(h is signal.SIG_DFL for h in handlers)  # no watchdog at all


def test_the_dataloaders_own_timeout_ends_in_the_same_line() -> None:
    # Outside the main thread there is no watchdog of ours; a DataLoader built with its
    # own timeout= (as a user's may be) ends in the same line, its worker killed.
    caught: list[BaseException] = []

    def run() -> None:
        loader = _loader(Blocked(), 1, timeout=1)
        try:
            with Batches(loader, 2.0, "test", "blocked") as batches:
                next(batches)
        except BaseException as e:
            caught.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], BatchTimeout), caught
    assert str(caught[0]) == (
        "test: no first batch from the DataLoader (blocked, num_workers=1) in 1 s (worker "
        f"start-up included): a worker is stuck {CAUSE}; {HINT}"
    )


class Blocked:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        threading.Event().wait()
        return i


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e9"])
def test_a_limit_that_is_no_number_of_seconds_is_one_line(cli, value: str) -> None:
    for command in ("loader", "starve", "profile", "doctor"):
        r = cli(command, "--batch-timeout", value)
        assert r.exit_code == 2
        assert r.stderr.splitlines() == [
            f"starvecheck: error: Invalid value for '--batch-timeout': {float(value):g}: "
            f"expected from 0 to 86,400 (see 'starvecheck {command} --help')"
        ]


def test_zero_is_accepted_on_the_command_line(cli) -> None:
    r = cli("starve", "--quick", "--workers", "0", "--steps", "1", "--batch-timeout", "0")
    assert r.exit_code == 0, r.stderr


class FirstFast:
    """The first batch at once, every later sample a minute: a worker's second batch is
    still in its hands when the first is read."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i >= 4:
            time.sleep(60)
        return i


@pytest.mark.parametrize("hurried", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_hurried_workers_are_not_waited_for_mid_batch(hurried: bool) -> None:
    """loader --factory's slow configurations (made.py) waited at each stop for the
    batch every worker had in hand: 1.6 s a configuration at 100 ms a sample, batch 16,
    on --quick's 30 s. Hurried, a worker mid-batch is killed after a short grace; not
    hurried, torch's shutdown asks and waits (here past its 5 s, then SIGTERM, which
    worker_init ignores, so stop_workers kills it)."""
    loader = _loader(FirstFast(), 1)
    with Batches(loader, 0, "test", "hurry") as batches:
        assert next(batches).tolist() == [0, 1, 2, 3]
        workers = list(batches._it._workers)
        if hurried:
            batches.hurry()
        began = time.monotonic()
    took = time.monotonic() - began
    assert all(not w.is_alive() for w in workers)
    assert all(w.exitcode == -signal.SIGKILL for w in workers)
    assert (took < 4.0) is hurried, took  # torch's join alone is 5 s
