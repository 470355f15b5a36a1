"""`loader --factory`: the user's code contained to the end of the run (issue 48, item
3). What the pipeline's code does after the measurement (a thread it left running, a
property read for the report, a thread that calls os._exit once the measurement is
done, a __len__ that changes its mind) ends in the report and exit 0 with what was
left said, or in one line and exit 2; never a hang, never exit 0 when the user's code
ended the process, never an internal error. Each case a real factory file and the real
command, in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import alive, children, marked
from tests.test_factory_user import factory as user_factory

QUICK = ("--quick", "--budget", "0.5", "--factory-timeout", "4")


def factory(tmp_path: Path, body: str) -> Path:
    return user_factory(tmp_path, body, "endpipe.py")


def start(
    pipe: Path, func: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "loader", "--factory", f"{pipe}:{func}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120", **(env or {})},
    )


def finish(p: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"still running after {timeout} s (a hang): {err[-2000:]}")
    return p.returncode, out, err


def one_error(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("starvecheck: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("func", ["prefetcher", "pool"])
def test_a_thread_the_factory_left_running_is_named_and_the_run_ends(
    tmp_path: Path, own_tmpdir: Path, func: str
) -> None:
    """A non-daemon thread (a prefetcher, a ThreadPoolExecutor task) kept Python's exit
    waiting for ever after the report: now it is named and the process ends, its
    multiprocessing directory (pymp-*) removed."""
    pipe = factory(
        tmp_path,
        """
        def prefetcher():
            threading.Thread(target=time.sleep, args=(1e6,), name="my-prefetcher").start()
            return DataLoader(Small(), batch_size=4)

        def pool():
            from concurrent.futures import ThreadPoolExecutor
            ThreadPoolExecutor(1, thread_name_prefix="my-pool").submit(time.sleep, 1e6)
            return DataLoader(Small(), batch_size=4)
        """,
    )
    report = tmp_path / "r.json"
    rc, _, err = finish(start(pipe, func, *QUICK, "--workers", "0,1", "--json", str(report)))
    assert rc == 0, err
    assert "Traceback" not in err, err
    assert "left 1 thread" in err and "my-p" in err, err
    caveats = json.dumps(json.loads(report.read_text())["stages"][0]["caveats"])
    assert "left 1 thread(s) running past the measurement" in caveats, caveats
    assert "my-p" in caveats, caveats
    assert not [n for n in os.listdir(own_tmpdir) if n.startswith(("pymp-", "starvecheck-"))]
    assert marked(str(tmp_path)) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("func", "line"),
    [
        ("shards_sleep", "num_shards did not return"),
        ("shards_exit", "num_shards raised SystemExit"),
        ("len_second", "RuntimeError: second"),
    ],
)
def test_a_property_read_after_the_measurement_is_contained(
    tmp_path: Path, func: str, line: str
) -> None:
    """num_shards read for the report (after the measurement, outside every time limit
    until now) that sleeps for ever, calls sys.exit(0) (exit 0, no report) or cannot be
    compared (exit 70); a __len__ that raises on its second call (exit 70, from the
    sampler of the batch read for /dev/shm's fit): one line and exit 2."""
    pipe = factory(
        tmp_path,
        """
        class Sleeps(Small):
            @property
            def num_shards(self):
                time.sleep(1e6)

        class Exits(Small):
            @property
            def num_shards(self):
                sys.exit(0)

        class Second(Small):
            calls = 0
            def __len__(self):
                Second.calls += 1
                if Second.calls > 1:
                    raise RuntimeError("second call")
                return 64

        def shards_sleep():
            return Sleeps()

        def shards_exit():
            return Exits()

        def len_second():
            return Second()
        """,
    )
    workers = "0,1" if func == "len_second" else "0"
    rc, _, err = finish(start(pipe, func, *QUICK, "--workers", workers))
    assert rc == 2, err
    assert line in one_error(err)


@pytest.mark.slow
def test_a_num_shards_of_an_int_class_that_cannot_compare_is_read_without_its_code(
    tmp_path: Path,
) -> None:
    """num_shards an int of the user's class whose comparison raises: exit 70 before;
    its value is read as an int's (int.__index__), none of its code called."""
    pipe = factory(
        tmp_path,
        """
        class Odd(int):
            def __gt__(self, other):
                raise RuntimeError("no comparing")
            __lt__ = __ge__ = __le__ = __eq__ = __index__ = __int__ = __gt__

        class Compares(Small):
            num_shards = Odd(3)

        def shards_compare():
            return Compares()
        """,
    )
    report = tmp_path / "r.json"
    rc, _, err = finish(
        start(pipe, "shards_compare", *QUICK, "--workers", "0", "--json", str(report))
    )
    assert rc == 0, err
    assert "Traceback" not in err, err
    assert json.loads(report.read_text())["stages"][0]["parameters"]["shards"] == 3


@pytest.mark.slow
def test_os_exit_from_a_daemon_thread_after_the_measurement_is_never_exit_0(
    tmp_path: Path,
) -> None:
    """A daemon thread of the factory's that calls os._exit(0) once the measurement is
    over (here: as the report is written) ended the run with exit 0, nothing said."""
    pipe = factory(
        tmp_path,
        """
        import atexit
        report = sys.argv[sys.argv.index("--json") + 1]

        def late():
            def go():
                while not os.path.exists(report):  # the measurement is over
                    time.sleep(0.01)
                os._exit(0)
            threading.Thread(target=go, daemon=True).start()
            atexit.register(time.sleep, 1.0)  # an exit handler that takes its time
            return DataLoader(Small(), batch_size=4)
        """,
    )
    report = tmp_path / "r.json"
    rc, _, err = finish(start(pipe, "late", *QUICK, "--workers", "0", "--json", str(report)))
    assert rc == 2, err
    assert "os._exit(0)" in one_error(err)


@pytest.mark.slow
def test_a_configuration_whose_epochs_shrank_is_listed_with_its_reason(tmp_path: Path) -> None:
    """__len__ 4096 then 1: the num_workers=1 configuration delivered no window and
    vanished from the table and the comparison; now it is listed with why."""
    pipe = factory(
        tmp_path,
        """
        class Shrinks(Small):
            calls = 0
            def __len__(self):
                Shrinks.calls += 1
                return 4096 if Shrinks.calls == 1 else 1

        def shrinks():
            return DataLoader(Shrinks(), batch_size=4)
        """,
    )
    report = tmp_path / "r.json"
    rc, _, err = finish(start(pipe, "shrinks", *QUICK, "--workers", "0,1", "--json", str(report)))
    assert rc == 0, err
    stage = json.loads(report.read_text())["stages"][0]
    caveats = " ".join(c["text"] if isinstance(c, dict) else str(c) for c in stage["caveats"])
    assert "num_workers=1" in caveats and "not read" in caveats, caveats


def _pdeath_pipe(tmp_path: Path) -> Path:
    return factory(
        tmp_path,
        """
        import ctypes
        def init(worker_id):
            libc = ctypes.CDLL(None)
            libc.prctl(1, int(os.environ["PDEATH"]), 0, 0, 0)  # PR_SET_PDEATHSIG

        class Slow(Small):
            def __getitem__(self, i):
                if torch.utils.data.get_worker_info() is not None:
                    # past every worker_init_fn: said, then busy in a sample (torch's
                    # watchdog never looks)
                    open(os.path.join(os.environ["BUSY"], f"busy-{os.getpid()}"), "a").close()
                    time.sleep(60)
                return super().__getitem__(i)

        def loader():
            return DataLoader(Slow(100000), batch_size=4, num_workers=2, worker_init_fn=init)
        """,
    )


@pytest.mark.slow
@pytest.mark.parametrize("pdeath", [signal.SIGTERM, 0])
def test_workers_die_with_a_sigkilled_run_whatever_worker_init_fn_set(
    tmp_path: Path, pdeath: int
) -> None:
    """A worker_init_fn that sets PR_SET_PDEATHSIG to SIGTERM itself (which the worker
    ignores: workers.worker_init) or clears it: the main process SIGKILLed, both
    workers were alive 23 s later. starvecheck's SIGKILL is armed again after the
    user's worker_init_fn."""
    pipe = _pdeath_pipe(tmp_path)
    p = start(
        pipe, "loader", "--budget", "60", "--workers", "2", "--batch-timeout", "120",
        env={"PDEATH": str(int(pdeath)), "BUSY": str(tmp_path)},
    )  # fmt: skip
    try:
        # Both workers in a sample, so past the worker_init_fn (ours and the user's): a
        # condition waited for, not a fixed sleep that a loaded machine can outrun.
        deadline = time.monotonic() + 120
        busy: list[int] = []
        while time.monotonic() < deadline and len(busy) < 2:
            time.sleep(0.2)
            busy = [int(f.name[5:]) for f in tmp_path.glob("busy-*")]
        assert len(busy) >= 2, "no workers started"
        kids = [k for k in marked(str(tmp_path)) if k != p.pid]
        assert set(busy) <= set(kids), (busy, kids)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)  # not its pipes: a worker left running holds them
        # A deadline, not a figure: a worker our SIGKILL missed sleeps out its 60 s.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(map(alive, kids)):
            time.sleep(0.1)
        still = [k for k in kids if alive(k)]
    finally:
        for k in children(p.pid):
            os.kill(k, signal.SIGKILL)
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
    for k in still:
        os.kill(k, signal.SIGKILL)
    assert still == [], "workers outlived the SIGKILLed run"
