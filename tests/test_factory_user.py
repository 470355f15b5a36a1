"""`loader --factory` runs the user's code in starvecheck's own process (importing FILE,
FUNC, and with num_workers=0 every sample and collate): what that code does to the
process must not take the run over. A factory that changes directory, installs its own
signal handlers or timer, calls os._exit, or hands back batches of nothing: each case a
real factory file and the real command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

HEAD = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    class Small(Dataset):
        def __init__(self, n=64):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return torch.full((4,), i, dtype=torch.int64)
    """
)


def factory(tmp_path: Path, body: str, name: str = "pipe.py") -> Path:
    path = tmp_path / name
    path.write_text(HEAD + textwrap.dedent(body))
    return path


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "starvecheck", "loader", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120", **(env or {})},
    )


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    errors = [x for x in r.stderr.splitlines() if x.startswith("starvecheck: error:")]
    assert len(errors) == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return errors[0]


QUICK = ("--quick", "--budget", "0.5", "--workers", "0")


# --- the working directory -------------------------------------------------------------


@pytest.mark.slow
def test_a_factory_that_changes_directory_leaves_the_outputs_where_asked(tmp_path: Path) -> None:
    """--json report.json is written in the directory the command ran in, not the one
    the factory moved to (whose report.json is someone else's), nor lost when that one
    is removed."""
    here, elsewhere, gone = tmp_path / "here", tmp_path / "elsewhere", tmp_path / "gone"
    for d in (here, elsewhere):
        d.mkdir()
    (elsewhere / "report.json").write_text("not yours\n")
    pipe = factory(
        tmp_path,
        f"""
        def moves():
            os.chdir({str(elsewhere)!r})
            return Small()

        def moves_and_removes():
            os.mkdir({str(gone)!r})
            os.chdir({str(gone)!r})
            os.rmdir({str(gone)!r})
            return Small()
        """,
    )
    for func in ("moves", "moves_and_removes"):
        out = here / f"{func}.json"
        r = run_cli("--factory", f"{pipe}:{func}", *QUICK, "--json", out.name, cwd=here)
        assert r.returncode == 0, r.stderr
        assert json.loads(out.read_text())["stages"][0]["parameters"]["source"] == "factory"
        assert "changed the working directory" in r.stderr
    assert (elsewhere / "report.json").read_text() == "not yours\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["report.json"]


@pytest.mark.slow
def test_a_factory_that_sets_the_umask_leaves_the_report_readable(tmp_path: Path) -> None:
    pipe = factory(tmp_path, "def closed():\n    os.umask(0o777)\n    return Small()\n")
    r = run_cli("--factory", f"{pipe}:closed", *QUICK, "--json", "r.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r.json").stat().st_mode & 0o600 == 0o600
    assert "set the umask to 777" in r.stderr


@pytest.mark.slow
def test_a_relative_factory_file_is_imported_again_after_it_moved(tmp_path: Path) -> None:
    """An IterableDataset is made afresh for each configuration: FILE.py, given relative,
    is found again after FUNC changed directory."""
    (tmp_path / "elsewhere").mkdir()
    factory(
        tmp_path,
        """
        class Stream(IterableDataset):
            def __iter__(self):
                for i in range(64):
                    yield torch.zeros(4)

        def stream():
            os.chdir("elsewhere")
            return Stream()
        """,
    )
    r = run_cli(
        "--factory", "pipe.py:stream", "--quick", "--budget", "0.5", "--workers", "0,1",
        "--json", "-", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    configs = json.loads(r.stdout)["stages"][0]["parameters"]["configurations"]
    assert {c["workers"] for c in configs} == {0, 1}


# --- signals and timers ----------------------------------------------------------------

SIGNALS = """
def quiet(signum, frame):
    pass

def own_handlers():
    signal.signal(signal.SIGTERM, quiet)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, quiet)
    return Slow()

class Slow(Small):
    def __getitem__(self, i):
        if i == 0:
            open(os.environ["READY"], "a").close()
        if os.environ.get("EVERY_SAMPLE"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(0.01)
        return super().__getitem__(i)

def own_timer():
    signal.signal(signal.SIGALRM, quiet)
    signal.setitimer(signal.ITIMER_REAL, 3600, 3600)

def timer():
    own_timer()
    return DataLoader(Stuck(), batch_size=4)

class Stuck(Small):
    def __getitem__(self, i):
        if i == 0:  # in the first batch, as a sample's own time limit would
            own_timer()
        if i > 20:
            threading.Event().wait()
        return super().__getitem__(i)
"""


@pytest.mark.slow
@pytest.mark.parametrize("every_sample", [False, True])
def test_the_factorys_own_signal_handlers_do_not_switch_off_sigterm(
    tmp_path: Path, every_sample: bool
) -> None:
    pipe = factory(tmp_path, SIGNALS)
    ready = tmp_path / "ready"
    (tmp_path / "tmp").mkdir()  # what a run killed here on failure leaves stays here
    env = {**os.environ, "READY": str(ready), "EVERY_SAMPLE": "1" if every_sample else ""}
    env["TMPDIR"] = str(tmp_path / "tmp")
    proc = subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "loader", "--factory", f"{pipe}:own_handlers",
         "--workers", "0", "--budget", "60", "--json", "-"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert "terminated by SIGTERM" in err and "Traceback" not in err
    assert "starvecheck kept its own" in err


@pytest.mark.slow
def test_the_factorys_own_timer_does_not_switch_off_the_batch_timeout(tmp_path: Path) -> None:
    """Its own SIGALRM handler and a timer left running, set by FUNC and by a sample:
    a sample that then never returns still ends at --batch-timeout."""
    pipe = factory(tmp_path, SIGNALS)
    started = time.monotonic()
    (tmp_path / "tmp").mkdir()
    env = {"TMPDIR": str(tmp_path / "tmp")}
    r = run_cli("--factory", f"{pipe}:timer", "--workers", "0", "--budget", "60",
                "--batch-timeout", "2", timeout=60, env=env)  # fmt: skip
    assert "starvecheck kept its own" in r.stderr
    assert r.returncode == 2, r.stderr
    assert "batch from the DataLoader (Stuck (Dataset), num_workers=0) in 2 s" in error_line(r)
    assert time.monotonic() - started < 40


# --- the ways user code ends the process ------------------------------------------------


def _short_tmpdir() -> str:
    # multiprocessing's socket paths must stay short (stages/dataloader/workers.py).
    return tempfile.mkdtemp(prefix="sc-", dir="/tmp")


@pytest.mark.slow
def test_a_killed_factory_run_leaves_what_clean_removes(tmp_path: Path) -> None:
    """The user's code kills the process (SIGKILL, as an out-of-memory kill does): the
    pymp-* directory multiprocessing made was recorded first, and `clean` removes it."""
    tmp = _short_tmpdir()
    try:
        pipe = factory(
            tmp_path,
            """
            class Dies(Small):
                def __getitem__(self, i):
                    if i == 3:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return super().__getitem__(i)

            def dies():
                return DataLoader(Dies(), batch_size=4)
            """,
        )
        r = run_cli("--factory", f"{pipe}:dies", "--quick", env={"TMPDIR": tmp})
        assert r.returncode == -signal.SIGKILL, r.stderr
        left = sorted(os.listdir(tmp))
        assert any(n.startswith("pymp-") for n in left), left
        assert any(n.startswith("starvecheck-factory-") for n in left), left
        c = subprocess.run(
            [sys.executable, "-m", "starvecheck", "clean", tmp],
            capture_output=True, text=True, timeout=60, env={**os.environ, "TMPDIR": tmp},
        )  # fmt: skip
        assert c.returncode == 0, c.stderr
        assert os.listdir(tmp) == [], (os.listdir(tmp), c.stdout)
    finally:
        for name in os.listdir(tmp):  # what a failed assertion left
            subprocess.run(["rm", "-rf", os.path.join(tmp, name)], check=False)
        os.rmdir(tmp)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["factory", "sample", "caught"])
def test_os_exit_in_the_users_code_is_one_line_and_exit_2(tmp_path: Path, where: str) -> None:
    tmp = _short_tmpdir()
    try:
        pipe = factory(
            tmp_path,
            """
            class Exits(Small):
                def __getitem__(self, i):
                    if i == 3:
                        os._exit(0)
                    return super().__getitem__(i)

            class Caught(Small):
                def __getitem__(self, i):
                    if i == 3:
                        try:
                            os._exit(0)
                        except Exception:
                            pass
                    return super().__getitem__(i)

            def factory():
                os._exit(0)

            def sample():
                return DataLoader(Exits(), batch_size=4)

            def caught():
                return DataLoader(Caught(), batch_size=4)
            """,
        )
        r = run_cli("--factory", f"{pipe}:{where}", *QUICK, env={"TMPDIR": tmp})
        assert r.returncode == 2, r.stderr
        assert "called os._exit(0)" in error_line(r)
        assert os.listdir(tmp) == []  # the run's own cleanup ran
    finally:
        for name in os.listdir(tmp):
            subprocess.run(["rm", "-rf", os.path.join(tmp, name)], check=False)
        os.rmdir(tmp)


@pytest.mark.slow
def test_workers_still_exit_through_os_exit(tmp_path: Path) -> None:
    """A forked DataLoader worker leaves through the real os._exit: a run with workers
    ends normally."""
    pipe = factory(tmp_path, "def loader():\n    return DataLoader(Small(), batch_size=4)\n")
    r = run_cli("--factory", f"{pipe}:loader", "--quick", "--budget", "0.5", "--workers", "2")
    assert r.returncode == 0, r.stderr


# --- what the pipeline hands back -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("func", "line"),
    [
        ("none_batches", "batch 0 is None"),
        ("empty_batches", "batch 0 is an empty list"),
        ("no_rows", "no elements"),
        ("nothing", "an epoch without a single batch"),
        ("dropped", "an epoch without a single batch"),
        ("exits", "batch 0: SystemExit"),
    ],
)
def test_a_pipeline_that_yields_nothing_is_one_line_and_exit_2(
    tmp_path: Path, func: str, line: str
) -> None:
    pipe = factory(
        tmp_path,
        """
        class Empty(IterableDataset):
            def __iter__(self):
                return iter(())

        def none_batches():
            return DataLoader(Small(), batch_size=4, collate_fn=lambda b: None)

        def empty_batches():
            return DataLoader(Small(), batch_size=4, collate_fn=lambda b: [])

        def no_rows():
            return DataLoader(Small(), batch_size=4, collate_fn=lambda b: torch.zeros(0, 4))

        def nothing():
            return Empty()

        def dropped():
            return DataLoader(Small(3), batch_size=4, drop_last=True)

        def exits():
            return DataLoader(Small(), batch_size=4, collate_fn=lambda b: sys.exit(0))
        """,
    )
    r = run_cli("--factory", f"{pipe}:{func}", *QUICK, "--fail-on", "warning")
    assert r.returncode == 2, r.stderr
    assert line in error_line(r)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("func", "line"),
    [
        ("later", "RuntimeError: gone"),
        ("half", "__len__ returned a float (3.5), not an integer"),
        ("negative", "the dataset is empty"),
    ],
)
def test_a_len_that_raises_later_or_is_no_integer_is_one_line(
    tmp_path: Path, func: str, line: str
) -> None:
    pipe = factory(
        tmp_path,
        """
        class Later(Small):
            calls = 0
            def __len__(self):
                Later.calls += 1
                if Later.calls > 1:
                    raise RuntimeError("gone")
                return 64

        class Half(Small):
            def __len__(self):
                return 3.5

        class Negative(Small):
            def __len__(self):
                return -1

        def later():
            return Later()

        def half():
            return Half()

        def negative():
            return Negative()
        """,
    )
    r = run_cli("--factory", f"{pipe}:{func}", *QUICK)
    assert r.returncode == 2, r.stderr
    assert line in error_line(r)
