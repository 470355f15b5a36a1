"""`starvecheck clean` against markers anyone who can write in PATH could forge: a dead
run's marker naming files outside PATH, shared memory a live process maps, stray files
named like markers or scratch directories, names holding control characters.

Every forged marker here is otherwise valid (this user's, this host and boot, a dead
pid), so only the proof of each path stands between it and the victim files, which lie
outside the scanned PATH and must survive, each refusal said."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from starvecheck import leftovers
from tests.conftest import run

PRECIOUS = b"not starvecheck's\n"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _forge(data: Path, name: str, *lines: object) -> Path:
    """A scratch directory of a dead run whose marker says `lines` after its owner."""
    d = data / name
    d.mkdir(parents=True)
    owner = {**leftovers.owner_record(), "pid": _dead_pid()}
    text = "".join(json.dumps(x) + "\n" for x in (owner, *lines))
    (d / leftovers.MARKER).write_text(text)
    (d / "shard.bin").write_bytes(b"x" * 100)
    return d


def _victim(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(PRECIOUS)
    return path


@pytest.fixture
def where(tmp_path: Path) -> dict[str, Path]:
    """PATH (data), the temporary directory clean is told about (tmp), and elsewhere."""
    dirs = {k: tmp_path / k for k in ("data", "tmp", "elsewhere")}
    for d in dirs.values():
        d.mkdir()
    return dirs


def _dead_listener(path: Path) -> None:
    """A socket file as a dead process leaves it: bound, then closed."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


# --- stray files named like ours ---------------------------------------------------------


def _stray_marker(d: Path, kind: str, elsewhere: Path) -> None:
    marker = d / leftovers.MARKER
    valid = json.dumps({**leftovers.owner_record(), "pid": _dead_pid()}) + "\n"
    if kind == "directory":
        marker.mkdir()
    elif kind == "fifo":
        os.mkfifo(marker)
    elif kind == "socket":
        _dead_listener(marker)
    elif kind == "link":
        (elsewhere / "marker").write_text(valid)
        marker.symlink_to(elsewhere / "marker")
    elif kind == "huge":
        with open(marker, "w") as f:
            f.write(valid)
            f.truncate(1 << 30)  # sparse
    elif kind == "unreadable":
        marker.write_text(valid)
        marker.chmod(0)
    elif kind == "foreign owner":
        marker.write_text(valid)
        os.chown(marker, 12345, 12345)
    elif kind == "deep json":
        marker.write_text("[" * 60_000)  # json.loads: RecursionError, not ValueError


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (a FIFO opened for reading waits for a writer)."""

    def fail(*_: object) -> None:
        raise AssertionError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


KINDS = ["directory", "fifo", "socket", "link", "huge", "unreadable", "foreign owner", "deep json"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_stray_marker_is_not_starvecheck_s_and_stops_nothing(where, kind) -> None:
    if kind == "foreign owner" and os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a file of mode 0")
    data = where["data"]
    d = data / "starvecheck-io-stray"
    d.mkdir()
    _stray_marker(d, kind, where["elsewhere"])
    with _deadline(120):
        (found,) = leftovers.scan(str(data))
        assert not found.removable and found.why.startswith("no starvecheck marker")
        r = run("clean", str(data))
        assert r.exit_code == 0, r.stderr
        assert f"left   {d}: no starvecheck marker" in r.stdout
        r = run("io", "--samples", "64", "--runs", "1", "--no-cold", str(data))
        assert r.exit_code == 0, r.stderr
    assert os.path.lexists(d / leftovers.MARKER)


def test_stray_entries_named_like_scratch_directories_stop_nothing(where) -> None:
    data = where["data"]
    (data / "starvecheck-file").write_bytes(PRECIOUS)
    os.mkfifo(data / "starvecheck-fifo")
    real = _forge(where["elsewhere"], "starvecheck-io-real")  # a dead run's, elsewhere
    (data / "starvecheck-link").symlink_to(real)
    with _deadline(120):
        r = run("clean", str(data))
        assert r.exit_code == 0 and "no starvecheck scratch directories" in r.stdout
        r = run("io", "--samples", "64", "--runs", "1", "--no-cold", str(data))
        assert r.exit_code == 0, r.stderr
    assert (data / "starvecheck-file").read_bytes() == PRECIOUS
    assert (real / "shard.bin").exists()  # never cleaned through the link
