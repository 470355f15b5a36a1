"""Shared helpers: run the CLI in-process with swapped streams (as httpie's tests do)."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from starvecheck.cli import main
from starvecheck.core.context import Context

# The fast lane runs in parallel on a busy machine: a property test's example may wait
# for a CPU far past hypothesis's 200 ms deadline (0.24 ms alone, 432 ms once there).
# What the properties check never depends on time.
# STARVECHECK_HYPOTHESIS=deep draws 20x the examples, to shake out a property by hand.
settings.register_profile("starvecheck", deadline=None)
settings.register_profile("deep", deadline=None, max_examples=2000)
settings.load_profile(
    "deep" if os.environ.get("STARVECHECK_HYPOTHESIS") == "deep" else "starvecheck"
)

FIXTURES = Path(__file__).parent / "fixtures"
SRC = Path(__file__).resolve().parents[1] / "src"
SYSROOTS = FIXTURES / "sysroots"


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


def run(*args: str, env: dict[str, str] | None = None, width: int = 100, stdin: str = "") -> Result:
    """Run `starvecheck ARGS` in this process, as a non-terminal with no colour."""
    out, err = io.StringIO(), io.StringIO()
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("STARVECHECK_SYSROOT", "KUBERNETES_SERVICE_HOST")
    }
    environ.update(env or {})
    context = Context(
        stdout=out,
        stderr=err,
        stdin=io.StringIO(stdin),
        environ=environ,
        stdout_isatty=False,
        width=width,
        now=lambda: "2026-11-21T00:00:00+00:00",
    )
    code = main(list(args), context)
    return Result(int(code), out.getvalue(), err.getvalue())


def source_env(**extra: str) -> dict[str, str]:
    """This process's environment with this checkout's sources first on PYTHONPATH,
    and `extra`: for starvecheck (or a job) run as a subprocess."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def sysroot_env(name: str) -> dict[str, str]:
    return {"STARVECHECK_SYSROOT": str(SYSROOTS / name)}


@pytest.fixture
def cli():
    return run


def tiny_tokenizer(path: Path) -> Path:
    """A real fast tokenizer, built here (no download): one token per word or
    punctuation mark, the words of a pangram known, anything else [UNK]."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"])
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]"
    )
    fast.save_pretrained(str(path))
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu`-marked tests without a CUDA device; torch is imported only when such a
    test was collected, so a run of CPU tests never pays for it."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    try:
        import torch

        available = bool(torch.cuda.is_available())
    except Exception:  # no torch, or a broken CUDA install: no device either way
        available = False
    if available:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def _tmpdirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where each test's own temporary directory is made: beside the real one (short,
    as multiprocessing's socket paths need), and removed when the session ends."""
    import shutil
    import tempfile

    # pytest fixes its own base (tmp_path's) on first use, from tempfile: before any
    # test's TMPDIR is swapped in.
    tmp_path_factory.getbasetemp()

    from multiprocessing import util

    base = Path(tempfile.mkdtemp(prefix="sc-tests-"))
    base.chmod(0o755)  # tests run commands as another user under it, as under /tmp
    yield base
    # Removed at exit after multiprocessing removes its own pymp-* (priority -100),
    # which an in-process test may have made in there.
    util.Finalize(None, shutil.rmtree, (str(base),), {"ignore_errors": True}, exitpriority=-200)


@pytest.fixture(autouse=True)
def own_tmpdir(_tmpdirs: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own temporary directory (TMPDIR, for the commands it runs
    too), made as /tmp is (sticky, writable by all): what multiprocessing (pymp-*),
    Streaming (locks) and starvecheck's own markers leave there is this test's alone,
    whatever other tests run beside it (xdist)."""
    import tempfile

    own = Path(tempfile.mkdtemp(prefix="t", dir=_tmpdirs))
    own.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(own))
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    # multiprocessing keeps the pymp-* it made for the process: this test makes its own.
    from multiprocessing import process

    monkeypatch.delitem(process.current_process()._config, "tempdir", raising=False)
    return own


def settled(new: Callable[[], set[str]], within: float = 120.0) -> set[str]:
    """What `new()` (names in /dev/shm made since a test began) still holds once it
    settles: /dev/shm is the machine's, and a test running beside this one (xdist)
    makes and removes its own there. Empty as soon as it is; what a run really left
    stays, and is returned after `within` seconds."""
    import time

    deadline = time.monotonic() + within
    while (left := new()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def children(pid: int) -> set[int]:
    """The pids of a process's children (its DataLoader workers, say), started by any
    of its threads."""
    found: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found |= {int(x) for x in f.read().split()}
    except OSError:
        pass
    return found


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie or a dead one does not). The state follows the
    last ')': a command name may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def marked(marker: str) -> list[int]:
    """Processes still running (not this one) whose command line holds `marker`: what a
    test's run left behind, where the marker is the test's own directory."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
        except OSError:
            continue
        if alive(int(entry)):
            found.append(int(entry))
    return found


def one_line(r: Result) -> str:
    """A refusal as the CLI promises it: exit 2 and one line on stderr, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.stdout[-300:], r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


# Runs the command and prints its peak RSS (KiB) last on stderr: the only child of a
# fresh process, so no other test's subprocess counts.
PEAK = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(r.returncode)"
)


def group_alive(pgid: int) -> list[int]:
    """Processes of the group that still run (zombies not counted: a container's init
    may never reap the orphans it inherits)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


@pytest.fixture
def machine_alone(monkeypatch):
    """A real loop under watch judged as if the machine were the loop's alone: no
    reading of the other processes' CPUs nor of the load average (the worker model's
    bound by the machine, advice/machinebound.py, has its own tests). On a shared test
    machine those readings would turn the answer these tests check into "too busy"."""
    from starvecheck.loop import cpu
    from starvecheck.probe import load

    monkeypatch.setattr(cpu, "MACHINE_EACH_S", 1e9)
    monkeypatch.setattr(load, "load_average", lambda root=None: None)


def deny_access(monkeypatch: pytest.MonkeyPatch, denied: Callable[[str], bool]) -> None:
    """The writer's access(2) (core/outputs.py, `permitted`) says no for every path
    `denied` names: a directory closed to us, as root, who may write anywhere. The
    writer asks relative to a directory it holds; the path is that directory's (from
    /proc/self/fd) joined with the name."""
    from starvecheck.core import outputs

    real = outputs.permitted

    def permitted(dir_fd: int, name: str, mode: int) -> bool:
        path = os.path.normpath(os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name))
        return not denied(path) and real(dir_fd, name, mode)

    monkeypatch.setattr(outputs, "permitted", permitted)
