"""Hostile round V, the environment (issue 58, part 5): what the process is started in.
A working directory removed after the shell entered it, every command from there; an
address-space limit (ulimit -v) at several sizes; few open files (ulimit -n); a file
size limit (ulimit -f, where the report's write fails: Python ignores SIGXFSZ, so it is
an error, not a kill); HOME and TMPDIR unset, missing or a file; the C locale with a
name that is not UTF-8; an empty PATH; standard input closed; files nested 100 to
100,000 levels deep; a workload that is a FIFO, /dev/zero or a sparse GiB.

Each case is a real run of `python -m starvecheck` in a subprocess, and each asserts:
no traceback and no fatal line from C (oneMKL's, Python's), no hang (a timeout), the
expected exit status (2 with one line where the environment is at fault, never 70),
no file made (the working directory, TMPDIR and the test's own directory as they were)
and no process left (none in the run's process group).
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import group_alive, source_env

PIPELINE = """\
import torch
from torch.utils.data import Dataset
class D(Dataset):
    def __len__(self): return 256
    def __getitem__(self, i): return torch.zeros(8)
def make(): return D()
"""
TIMEOUT_S = 90
# What only the C side of a crash says: oneMKL's line from a removed working
# directory, Python's own fatal error, glibc's and C++'s aborts.
FATAL = ("FATAL ERROR", "Fatal Python error", "Traceback", "terminate called", "ABORT")
IO = ("--quick", "--samples", "64", "--runs", "1", "--threads", "1", "--no-cold")
CD = "cd to an existing directory and rerun"
RELATIVE = "a relative path, and the working directory no longer exists"
AS, NOFILE, FSIZE = resource.RLIMIT_AS, resource.RLIMIT_NOFILE, resource.RLIMIT_FSIZE


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]  # after `starvecheck`; {d} is the test's own directory
    status: int
    said: str | None = None  # in stderr: the one line, where status is 2
    gone: bool = False  # run from a working directory removed after the shell entered it
    limits: tuple[tuple[int, int], ...] = ()  # (RLIMIT_*, soft and hard)
    env: tuple[tuple[str, str | None], ...] = ()  # None: unset
    stdin_closed: bool = False
    quiet: bool = False  # and nothing else at all on stderr


def kib(n: int) -> int:
    return n << 10


CASES = {
    # --- a working directory removed after the shell entered it ------------------------
    "gone: env": Case(("env",), 0, gone=True),
    "gone: env --help": Case(("env", "--help"), 0, gone=True, quiet=True),
    "gone: --version": Case(("--version",), 0, gone=True, quiet=True),
    "gone: io": Case(
        ("io", "--quick"),
        2,
        "no longer exists (removed after the shell entered it): give io a PATH",
        gone=True,
    ),
    "gone: io PATH": Case(("io", "{d}/data", *IO), 0, gone=True),
    "gone: loader": Case(("loader", "--quick"), 2, CD, gone=True),
    "gone: loader PATH": Case(("loader", "{d}/data", "--quick"), 2, CD, gone=True),
    "gone: loader --factory FILE": Case(
        ("loader", "--factory", "{d}/p.py:make", "--quick"), 2, CD, gone=True
    ),
    "gone: loader --factory relative FILE": Case(
        ("loader", "--factory", "p.py:make", "--quick"), 2, CD, gone=True
    ),
    "gone: loader --help": Case(("loader", "--help"), 0, gone=True, quiet=True),
    "gone: starve": Case(("starve", "--quick"), 2, CD, gone=True),
    "gone: pcie": Case(("pcie", "--quick"), 2, CD, gone=True),
    "gone: doctor": Case(("doctor", "--quick"), 2, CD, gone=True),
    "gone: doctor --quick PATH": Case(("doctor", "{d}/data", "--quick"), 2, CD, gone=True),
    "gone: doctor, pad alone": Case(
        ("doctor", "--only", "pad", "--step-ms", "100", "--quick"), 0, gone=True
    ),
    "gone: doctor --workload relative": Case(
        ("doctor", "--quick", "--workload", "w.toml"), 2, RELATIVE, gone=True
    ),
    "gone: profile": Case(("profile", "--quick"), 2, CD, gone=True),
    "gone: profile --trace relative": Case(
        ("profile", "--trace", "t.json"), 2, RELATIVE, gone=True
    ),
    "gone: pad": Case(("pad",), 0, gone=True),
    "gone: pad --json relative": Case(("pad", "--json", "r.json"), 2, RELATIVE, gone=True),
    "gone: pad --plot relative": Case(("pad", "--plot", "r.png"), 2, RELATIVE, gone=True),
    "gone: pad --dataset relative": Case(("pad", "--dataset", "d.jsonl"), 2, RELATIVE, gone=True),
    "gone: env relative PATH": Case(("env", "data"), 2, RELATIVE, gone=True),
    "gone: clean .": Case(("clean", "."), 2, RELATIVE, gone=True),
    "gone: clean PATH": Case(("clean", "{d}/data"), 0, gone=True),
    "gone: attach --json relative": Case(
        ("attach", str(os.getpid()), "--json", "a.json"), 2, RELATIVE, gone=True
    ),
    # --- an address-space limit (ulimit -v) ---------------------------------------------
    "ulimit -v 20000: env": Case(
        ("env",), 2, "address-space limit (ulimit -v", limits=((AS, kib(20_000)),)
    ),
    "ulimit -v 30000: --version": Case(("--version",), 0, limits=((AS, kib(30_000)),)),
    "ulimit -v 200000: env": Case(("env",), 0, limits=((AS, kib(200_000)),)),
    "ulimit -v 30000: io": Case(
        ("io", "{d}/data", *IO), 2, "address-space limit (ulimit -v", limits=((AS, kib(30_000)),)
    ),
    "ulimit -v 50000: io, one thread": Case(
        ("io", "{d}/data", *IO), 0, limits=((AS, kib(50_000)),)
    ),
    "ulimit -v 100000: pad": Case(
        ("pad",),
        2,
        "(ulimit -v 100000: 98 MiB) is too small to load numpy",
        limits=((AS, kib(100_000)),),
    ),
    "ulimit -v 300000: loader --factory": Case(
        ("loader", "--factory", "{d}/p.py:make", "--quick"),
        2,
        "(ulimit -v 300000: 293 MiB) is too small to load torch",
        limits=((AS, kib(300_000)),),
    ),
    "ulimit -v 500000: loader": Case(
        ("loader", "{d}/data", "--quick"),
        2,
        "too small to load torch",
        limits=((AS, kib(500_000)),),
    ),
    "ulimit -v 500000: starve": Case(
        ("starve", "--quick"), 2, "too small to load torch", limits=((AS, kib(500_000)),)
    ),
    "ulimit -v 300000: pcie": Case(
        ("pcie", "--quick"), 2, "too small to load torch", limits=((AS, kib(300_000)),)
    ),
    "ulimit -v 600000: doctor": Case(
        ("doctor", "{d}/data", "--quick"),
        2,
        "too small to load torch",
        limits=((AS, kib(600_000)),),
    ),
    "ulimit -v 800000: profile": Case(
        ("profile", "{d}/data", "--quick"),
        2,
        "too small to load torch",
        limits=((AS, kib(800_000)),),
    ),
    # --- few open files (ulimit -n) ------------------------------------------------------
    "ulimit -n 8: env": Case(("env",), 0, limits=((NOFILE, 8),)),
    "ulimit -n 8: pad": Case(("pad",), 0, limits=((NOFILE, 8),)),
    "ulimit -n 16: io": Case(("io", "{d}/data", *IO), 0, limits=((NOFILE, 16),)),
    "ulimit -n 16: loader --factory": Case(
        ("loader", "--factory", "{d}/p.py:make", "--quick"),
        2,
        "open-file limit is 16",
        limits=((NOFILE, 16),),
    ),
    # --- a file size limit (ulimit -f): the write fails, one line, nothing half-written ---
    "ulimit -f 1KiB: env --json": Case(
        ("env", "--json", "{d}/out/r.json"),
        2,
        "r.json: cannot write it: File too large",
        limits=((FSIZE, 1024),),
    ),
    "ulimit -f 16KiB: io": Case(
        ("io", "{d}/data", *IO, "--sample-size", "64K"),
        2,
        "failed: File too large",
        limits=((FSIZE, 16 << 10),),
    ),
    "ulimit -f 1KiB: pad --plot": Case(
        ("pad", "--plot", "{d}/out/p.png"),
        2,
        "p.png: cannot write it: File too large",
        limits=((FSIZE, 1024),),
    ),
    # --- HOME and TMPDIR -------------------------------------------------------------------
    "HOME unset: pad --plot": Case(
        ("pad", "--plot", "{d}/out/p.png"), 0, env=(("HOME", None),), quiet=True
    ),
    "HOME a file: pad --plot": Case(
        ("pad", "--plot", "{d}/out/p.png"), 0, env=(("HOME", "{d}/afile"),), quiet=True
    ),
    "TMPDIR missing: pad --plot": Case(
        ("pad", "--plot", "{d}/out/p.png"), 0, env=(("TMPDIR", "{d}/missing"),), quiet=True
    ),
    "TMPDIR a file: env": Case(("env",), 0, env=(("TMPDIR", "{d}/afile"),)),
    "TMPDIR /proc: io": Case(("io", "{d}/data", *IO), 0, env=(("TMPDIR", "/proc"),)),
    # --- the locale, PATH, standard input --------------------------------------------------
    "LANG=C: a --json name not UTF-8": Case(
        ("env", "--json", "{d}/out/\udcff.json"), 0, env=(("LANG", "C"), ("LC_ALL", "C"))
    ),
    "LANG=C: a PATH not UTF-8": Case(
        ("io", "{d}/\udcffmissing", "--quick"),
        2,
        "\\xffmissing: no such file or directory",
        env=(("LANG", "C"), ("LC_ALL", "C")),
    ),
    "PATH empty: env": Case(("env",), 0, env=(("PATH", ""),)),
    "PATH empty: pad": Case(("pad",), 0, env=(("PATH", ""),)),
    "stdin closed: env": Case(("env",), 0, stdin_closed=True),
    "stdin closed: profile --trace -": Case(
        ("profile", "--trace", "-"), 2, "--trace -: standard input is closed", stdin_closed=True
    ),
    # --- files nested deep -----------------------------------------------------------------
    **{
        f"workload nested {n}": Case(
            ("doctor", "--only", "pad", "--step-ms", "100", "--workload", f"{{d}}/w{n}.toml"),
            2,
            "nested deeper than 32 levels",
        )
        for n in (100, 1000, 100_000)
    },
    "workload dotted key of 100,000 parts": Case(
        ("doctor", "--only", "pad", "--step-ms", "100", "--workload", "{d}/dotted.toml"),
        2,
        "nested deeper than 32 levels",
    ),
    **{
        f"dataset JSON Lines nested {n}": Case(
            ("pad", "--dataset", f"{{d}}/d{n}.jsonl"), 2, "line 1: JSON nested too deeply"
        )
        for n in (1000, 100_000)
    },
    "dataset JSON array nested 100,000": Case(
        ("pad", "--dataset", "{d}/d.json"), 2, "JSON nested too deeply"
    ),
    "trace nested 100,000": Case(
        ("profile", "--trace", "{d}/t.json"),
        2,
        "not a Chrome trace (JSON nested too deeply to read)",
    ),
    # --- a workload that is not a file -------------------------------------------------
    "workload a FIFO": Case(
        ("doctor", "--quick", "--workload", "{d}/fifo.toml"),
        2,
        "a FIFO (named pipe), not a regular file",
    ),
    "workload /dev/zero": Case(
        ("doctor", "--quick", "--workload", "/dev/zero"),
        2,
        "a character device, not a regular file",
    ),
    "workload a sparse GiB": Case(
        ("doctor", "--quick", "--workload", "{d}/sparse.toml"), 2, "1 GiB, over 1 MiB (the limit)"
    ),
}


def prepare(d: Path) -> None:
    """The test's own directory: the pipeline, a data directory, an output directory,
    a plain file, the nested files and the odd ones."""
    d.mkdir()
    (d / "p.py").write_text(PIPELINE)
    (d / "data").mkdir()
    (d / "out").mkdir()
    (d / "afile").write_text("")
    for n in (100, 1000, 100_000):
        (d / f"w{n}.toml").write_text("a = " + "[" * n + "]" * n + "\n")
        (d / f"d{n}.jsonl").write_text('{"text": ' + "[" * n + "]" * n + "}\n")
    (d / "dotted.toml").write_text("batch_size." + "a." * 100_000 + "b = 1\n")
    (d / "d.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "t.json").write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
    os.mkfifo(d / "fifo.toml")
    with open(d / "sparse.toml", "wb") as f:
        f.truncate(1 << 30)


def listing(d: Path) -> dict[str, list[str]]:
    return {str(p): sorted(os.listdir(p)) for p in (d, d / "data", d / "out")}


def launch(
    case: Case, d: Path, here: Path, python: tuple[str, ...] = ()
) -> tuple[int, str, subprocess.Popen[bytes]]:
    """Run the case (`python`: options for the interpreter); (status, stderr, the
    process)."""
    argv = [a.replace("{d}", str(d)) for a in case.argv]
    env = source_env(NO_COLOR="1", COLUMNS="200")
    for name, value in case.env:
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value.replace("{d}", str(d))
    command = [sys.executable, *python, "-m", "starvecheck", *argv]
    if case.gone:  # the shell enters it, then it is removed: as `rmdir "$PWD"` does
        command = ["sh", "-c", 'cd "$0" && rmdir "$0" && exec "$@"', str(here), *command]

    def before() -> None:
        for which, value in case.limits:
            resource.setrlimit(which, (value, value))
        if case.stdin_closed:
            os.close(0)

    p = subprocess.Popen(
        command, cwd=here, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, preexec_fn=before, start_new_session=True,
    )  # fmt: skip
    try:
        _, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"a hang: {case}")
    return p.returncode, err.decode("utf-8", "backslashreplace"), p


def left(pgid: int) -> list[int]:
    """What still runs in the run's process group, once it had a moment to end."""
    deadline = time.monotonic() + 5
    while (alive := group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.mark.parametrize("name", CASES)
def test_hostile_environment(tmp_path: Path, own_tmpdir: Path, name: str) -> None:
    case = CASES[name]
    d = tmp_path / "d"
    prepare(d)
    here = tmp_path / "here"
    here.mkdir()
    if not case.gone:
        (here / "theirs.txt").write_text("the user's\n")
    before = listing(d)
    status, err, p = launch(case, d, here)
    stray = left(p.pid)
    for pid in stray:
        os.kill(pid, signal.SIGKILL)
    assert not any(f in err for f in FATAL), err
    assert status == case.status, err
    errors = [line for line in err.splitlines() if line.startswith("starvecheck: error:")]
    if case.status == 2:
        assert err.count("\n") == 1 and len(errors) == 1, err
        assert case.said in err, err
    else:
        assert errors == [], err
    if case.quiet:
        assert err == "", err
    after = listing(d)
    written = {p for p in after[str(d / "out")] if p not in before[str(d / "out")]}
    if status == 0 and "{d}/out/" in " ".join(case.argv):
        assert len(written) == 1, after  # the report or the picture asked for, only
    else:
        assert written == set(), after
    assert {k: v for k, v in after.items() if not k.endswith("/out")} == {
        k: v for k, v in before.items() if not k.endswith("/out")
    }
    assert sorted(os.listdir(tmp_path)) == (["d"] if case.gone else ["d", "here"])
    if not case.gone:
        assert os.listdir(here) == ["theirs.txt"]
    assert os.listdir(own_tmpdir) == [], os.listdir(own_tmpdir)
    assert stray == [], f"processes left: {stray}"


def test_the_sweep_is_at_least_25_cases() -> None:
    assert len(CASES) >= 25
    assert sum(c.gone for c in CASES.values()) >= 12  # every command from a removed cwd


@pytest.mark.parametrize(
    ("where", "limit"), [("a removed working directory", None), ("ulimit -v 300000", 300_000)]
)
def test_refused_before_torch_is_imported(tmp_path: Path, where: str, limit: int | None) -> None:
    """The refusal comes before `import torch` (python -X importtime lists every module
    imported: torch is not among them)."""
    d = tmp_path / "d"
    prepare(d)
    here = tmp_path / "here"
    here.mkdir()
    case = Case(
        ("loader", "--factory", "{d}/p.py:make", "--quick"), 2, gone=limit is None,
        limits=((AS, kib(limit)),) if limit else (),
    )  # fmt: skip
    status, err, _ = launch(case, d, here, ("-X", "importtime"))
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert status == 2 and len(said) == 1 and said[0].startswith("starvecheck: error:"), err
    assert not re.search(r"\|\s+(torch|numpy)$", err, re.M), "torch was imported first"
    assert re.search(r"\|\s+starvecheck\.cli\.main$", err, re.M)  # the list is there


SWEEP_KIB = (200_000, 300_000, 500_000, 800_000, 1_000_000, 1_500_000, 2_000_000, 3_000_000)
SWEEP = {
    "env": ("env",),
    "loader --factory": ("loader", "--factory", "{d}/p.py:make", "--quick"),
    "pad": ("pad",),
    "io": ("io", "{d}/data", *IO),
}


# A run of torch and the user's pipeline takes seconds: those in the slow lane.
SWEEP_RUNS = [
    pytest.param(command, marks=pytest.mark.slow) if command == "loader --factory" else command
    for command in SWEEP
]


@pytest.mark.parametrize("command", SWEEP_RUNS)
@pytest.mark.parametrize("limit", SWEEP_KIB)
def test_an_address_space_limit_runs_or_is_one_line(
    tmp_path: Path, own_tmpdir: Path, command: str, limit: int
) -> None:
    """At every size: the run, or one line naming the limit; never exit 70 (torch's
    "failed to map segment"), 127 (OpenBLAS's abort), 134 (std::bad_alloc) or a hang
    (the exit handlers' thread that could not start)."""
    d = tmp_path / "d"
    prepare(d)
    here = tmp_path / "here"
    here.mkdir()
    case = Case(SWEEP[command], 0, limits=((AS, kib(limit)),))
    status, err, p = launch(case, d, here)
    assert left(p.pid) == []
    assert not any(f in err for f in FATAL), err
    assert status in (0, 2), err
    if status == 2:
        assert err.count("\n") == 1 and f"ulimit -v {limit}" in err, err
    assert os.listdir(here) == [] and os.listdir(d / "data") == []
    assert os.listdir(own_tmpdir) == []
