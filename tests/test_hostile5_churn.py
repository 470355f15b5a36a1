"""The fifth hostile sweep, the sidecar over PID churn (issue 58, item 2): what `attach
--every` reads of the job between windows (probe/life.py) and how it words a change
(cli/windows.py), against a /proc that churns as a hostile or unlucky machine makes it:
a PID reused, exec'd, ended, stopped, its files garbage, unreadable, FIFOs or links,
a command line that is not UTF-8. Each case asserts: no exception, no wait (every
reading under a time limit, in a thread), the verdict expected; the property draws
garbage for every file. Two cases run the real command on a job that ends between
windows (exited, killed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.cli.windows import _moved, _replaced
from starvecheck.core.context import Context
from starvecheck.probe.life import Life, read_life
from starvecheck.probe.sysroot import SysRoot
from tests.loops.loopstate import stop_tree
from tests.test_attach_identity import _started

PID = 4242
STAT = "4242 (python) S 1 4242 4242 0 -1 0 0 0 0 0 5 3 0 0 20 0 1 0 {start} 0 0\n"
CMD = b"python\0train.py\0--epochs\0" + b"3\0"


def _proc(root: Path, **files: bytes | str | None) -> None:
    """A fake /proc/PID: stat, cmdline, auxv as given (None: absent), exe and ns/pid as
    link targets."""
    d = root / "proc" / str(PID)
    d.mkdir(parents=True, exist_ok=True)
    (d / "ns").mkdir(exist_ok=True)
    defaults: dict[str, bytes | str | None] = {
        "stat": STAT.format(start=1000),
        "cmdline": CMD,
        "auxv": b"\x21\0\0\0\0\0\0\0" + b"A" * 24,
        "exe": "/usr/bin/python3.11",
        "ns/pid": "pid:[4026531836]",
    }
    for name, value in {**defaults, **files}.items():
        path = d / name
        if path.is_symlink() or path.exists():
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        if value is None:
            continue
        if name in ("exe", "ns/pid"):
            path.symlink_to(value)
        elif isinstance(value, bytes):
            path.write_bytes(value)
        else:
            path.write_text(value)


def _read(root: Path) -> Life | None:
    """read_life in a thread, within 5 s: a reading that waits is a failure."""
    got: list[Life | None] = []
    t = threading.Thread(target=lambda: got.append(read_life(PID, SysRoot(root))), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "reading the process waited"
    return got[0]


def _fifo(path: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)


# (what changes between the first reading and the next, the verdict's words or None)
CHURN = [
    ("nothing", {}, None),
    ("start time", {"stat": STAT.format(start=1001)}, "its start time is not the job's"),
    ("PID namespace", {"ns/pid": "pid:[4026532999]"}, "another PID namespace"),
    ("program", {"exe": "/usr/bin/sleep"}, "runs another program now"),
    ("program image", {"auxv": b"\x21\0\0\0\0\0\0\0" + b"B" * 24}, "it called exec"),
    ("command line", {"cmdline": b"python\0other.py\0"}, "it called exec"),
    ("binary upgraded on disk", {"exe": "/usr/bin/python3.11 (deleted)"}, None),
    ("command line emptied (exiting)", {"cmdline": b""}, None),
    ("auxv gone", {"auxv": None}, None),
    ("auxv empty", {"auxv": b""}, None),
    ("exe gone (no permission)", {"exe": None}, None),
    ("ns gone", {"ns/pid": None}, None),
    ("stopped (SIGSTOP)", {"stat": STAT.format(start=1000).replace(" S ", " T ")}, None),
    ("traced", {"stat": STAT.format(start=1000).replace(" S ", " t ")}, None),
    ("zombie", {"stat": STAT.format(start=1000).replace(" S ", " Z ")}, "ended"),
    ("dead", {"stat": STAT.format(start=1000).replace(" S ", " X ")}, "ended"),
    ("stat gone (reaped)", {"stat": None}, "gone"),
    ("stat garbage", {"stat": "\x00\xff garbage ))) ((("}, "gone"),
    ("stat cut short", {"stat": "4242 (python) S 1 4242"}, "gone"),
    ("start not a number", {"stat": STAT.format(start="x1000")}, None),
    (
        "comm with ') (' and spaces",
        {"stat": STAT.format(start=1000).replace("(python)", "(a) (b c) S)")},
        None,
    ),
    (
        "comm with newline",
        {"stat": STAT.format(start=1000).replace("(python)", "(py\nthon)")},
        None,
    ),
    ("cmdline not UTF-8, same bytes", {"cmdline": b"\xff\xfe\0train\0"}, "it called exec"),
    ("cmdline grown to 1 MiB", {"cmdline": CMD + b"x" * (1 << 20)}, "it called exec"),
    ("exe to a non-UTF-8 name", {"exe": os.fsdecode(b"/usr/bin/py\xfflon")}, "another program"),
    ("exe a link to itself", {"exe": "exe"}, "another program"),
]


@pytest.mark.parametrize(("what", "change", "said"), CHURN, ids=[c[0] for c in CHURN])
def test_the_job_read_again_after_churn(tmp_path: Path, what: str, change: dict, said) -> None:
    _proc(tmp_path)
    job = _read(tmp_path)
    assert job is not None and job.start == 1000 and job.image is not None
    _proc(tmp_path, **change)
    now = _read(tmp_path)
    if said == "gone":
        assert now is None
        return
    assert now is not None
    if said == "ended":
        assert now.ended
        assert _moved(Context(), PID, job, now, 3) is None  # an end, not another process
        return
    why = _replaced(job, now)
    assert (why is None) if said is None else (said in why), why


@pytest.mark.parametrize("name", ["stat", "cmdline", "auxv"])
def test_a_fifo_for_a_file_of_the_job_is_never_waited_on(tmp_path: Path, name: str) -> None:
    """A fake machine's tree (STARVECHECK_SYSROOT) with a FIFO no process writes: the
    reading ends at once (before: open() waited for a writer for ever)."""
    _proc(tmp_path)
    _fifo(tmp_path / "proc" / str(PID) / name)
    now = _read(tmp_path)
    if name == "stat":
        assert now is None
    else:
        assert now is not None and now.start == 1000


def test_a_directory_for_a_file_of_the_job_is_no_reading(tmp_path: Path) -> None:
    _proc(tmp_path, auxv=None, cmdline=None)
    d = tmp_path / "proc" / str(PID)
    (d / "auxv").mkdir()
    (d / "cmdline").mkdir()
    now = _read(tmp_path)
    assert now is not None and now.image is None and now.cmdline is None


_FILES = st.fixed_dictionaries(
    {
        "stat": st.one_of(st.none(), st.binary(max_size=300), st.text(max_size=300)),
        "cmdline": st.one_of(st.none(), st.binary(max_size=300)),
        "auxv": st.one_of(st.none(), st.binary(max_size=64)),
        # A link's target is bytes: any text the file system can hold, and bytes that
        # are no UTF-8 (read back by Python as surrogate escapes). A lone surrogate is
        # no file name (it cannot be made, so it is not generated).
        "exe": st.one_of(
            st.none(),
            st.text(
                alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                min_size=1,
                max_size=80,
            ),
            st.binary(min_size=1, max_size=80).filter(lambda b: b"\0" not in b).map(os.fsdecode),
        ),
    }
)


@given(first=_FILES, later=_FILES)
def test_garbage_in_every_file_never_raises(tmp_path_factory, first: dict, later: dict) -> None:
    root = tmp_path_factory.mktemp("proc")
    _proc(root, **first)
    job = _read(root)
    _proc(root, **later)
    now = _read(root)
    if job is not None and now is not None:
        why = _replaced(job, now)
        assert why is None or isinstance(why, str)
        assert _replaced(job, job) is None  # a reading is always its own process
        _moved(Context(), PID, job, now, 1)


def test_a_reading_compared_with_itself_or_with_less_is_the_same_job() -> None:
    job = Life("S", 1000, "/usr/bin/python3", "python train.py", "pid:[1]", "aa")
    for missing in ("start", "exe", "cmdline", "pidns", "image"):
        assert _replaced(job, replace(job, **{missing: None})) is None, missing


# --- the real command on a job that ends between windows --------------------------------

LOOP = Path(__file__).parent / "loops" / "attach_loop.py"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exits", "killed"])
def test_a_job_that_ends_between_windows_ends_the_watch_with_its_report(
    tmp_path: Path, how: str
) -> None:
    state = tmp_path / "state.json"
    loop = subprocess.Popen([sys.executable, str(LOOP), "data", str(state)], start_new_session=True)
    side = None
    try:
        _started(state, loop)
        last = tmp_path / "last.json"
        cmd = [sys.executable, "-m", "starvecheck", "attach", str(loop.pid), "--every", "6",
               "--duration", "2", "--json", str(last)]  # fmt: skip
        side = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
        assert side.stderr is not None
        assert "attach window 1" in side.stderr.readline()
        if how == "exits":
            os.killpg(loop.pid, signal.SIGTERM)
        else:
            os.killpg(loop.pid, signal.SIGKILL)
        loop.wait(30)
        _, err = side.communicate(timeout=120)
        assert "Traceback" not in err, err
        assert "attach window 2" not in err or "no longer" not in err, err
        assert side.returncode in (0, 1, 2), err
        errors = [x for x in err.splitlines() if x.startswith("starvecheck: error")]
        assert len(errors) <= 1, err
        if side.returncode in (0, 1):
            assert json.loads(last.read_text())["stages"][0]["stage"] == "attach"
    finally:
        stop_tree(loop)
        if side is not None and side.poll() is None:
            side.kill()
            side.wait()
