"""Every output written safely (issue 48, item 1): --json, --markdown and --plot are
written under a temporary name made with O_EXCL|O_NOFOLLOW in the target's directory,
then renamed over it, so a link swapped in at the last moment is replaced, never written
through; an existing FIFO, /dev/null or /dev/stdout is opened without blocking (a FIFO
with no reader is one line and exit 2); the file's mode comes from the umask read at
start-up, whatever a thread or the user's code set since; the temporary file is removed
on failure and on Ctrl-C."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from starvecheck.core import outputs
from tests.conftest import one_line, run, source_env

VICTIM_TEXT = "root-only secret, must survive\n"
NO_LINK = "starvecheck writes through no link; name the file itself"


def _env() -> dict[str, str]:
    return source_env(STARVECHECK_DEBUG="")


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def _swap_before_writing(monkeypatch: pytest.MonkeyPatch, swap) -> None:
    """Run `swap` after the report is rendered, just before it is written: the last
    moment an attacker has."""
    from starvecheck.render import json as json_export

    real = json_export.serialize

    def rendered(report):
        text = real(report)
        swap()
        return text

    monkeypatch.setattr(json_export, "serialize", rendered)


@pytest.mark.parametrize("existed", [True, False], ids=["file-replaced", "link-planted"])
def test_a_link_swapped_in_after_rendering_is_refused_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existed: bool
) -> None:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    before = victim.stat()
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "r.json"
    if existed:
        target.write_text("old report\n")

    def swap() -> None:
        if target.exists() or target.is_symlink():
            target.unlink()
        target.symlink_to(victim)

    _swap_before_writing(monkeypatch, swap)
    err = one_line(run("pad", "--quick", "--json", str(target)))
    assert err.endswith(f"--json {target}: a symbolic link: {NO_LINK}\n"), err
    assert victim.read_text() == VICTIM_TEXT
    assert victim.stat().st_mtime_ns == before.st_mtime_ns
    assert target.is_symlink()
    assert _leftovers(shared, {"r.json"}) == []


def test_a_link_swapped_in_while_writing_is_replaced_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last moment: the report is in its temporary file, not yet renamed."""
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    before = victim.stat()
    target = tmp_path / "shared" / "r.json"
    target.parent.mkdir()
    target.write_text("old report\n")
    real = os.fsync

    def swap(fd: int) -> None:
        real(fd)
        target.unlink()
        target.symlink_to(victim)

    monkeypatch.setattr(outputs.os, "fsync", swap)
    r = run("pad", "--quick", "--json", str(target))
    assert r.exit_code == 0, r.stderr
    assert victim.read_text() == VICTIM_TEXT
    assert victim.stat().st_mtime_ns == before.st_mtime_ns
    assert not target.is_symlink()
    assert json.loads(target.read_text())["command"] == "pad"
    assert _leftovers(target.parent, {"r.json"}) == []


def test_a_link_named_as_the_output_is_refused_before_measuring(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    link = tmp_path / "r.json"
    link.symlink_to(victim)
    r = run("pad", "--quick", "--json", str(link))
    assert "symbolic link" in one_line(r)
    assert r.stdout == ""
    assert victim.read_text() == VICTIM_TEXT and link.is_symlink()


def test_a_fifo_with_no_reader_is_one_line_within_seconds(tmp_path: Path) -> None:
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    p = subprocess.run(
        [sys.executable, "-m", "starvecheck", "pad", "--quick", "--json", str(fifo)],
        env=_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert "no process reads it" in p.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert _leftovers(tmp_path, {"r.json"}) == []


def test_a_fifo_with_a_reader_gets_the_whole_report(tmp_path: Path) -> None:
    fifo = tmp_path / "r.md"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "starvecheck", "pad", "--quick", "--markdown", str(fifo)],
            env=_env(),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        out, _ = reader.communicate(timeout=30)
    finally:
        reader.kill()
    assert p.returncode == 0, p.stderr
    assert out.startswith("#") and "pad" in out


@pytest.mark.parametrize("device", ["/dev/null", "/dev/stdout"])
def test_dev_null_and_dev_stdout_still_work(tmp_path: Path, device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} is not there")
    p = subprocess.run(
        [sys.executable, "-m", "starvecheck", "pad", "--quick", "--json", device],
        env=_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    if device == "/dev/stdout":
        start = p.stdout.index("{")
        decoded, _ = json.JSONDecoder().raw_decode(p.stdout[start:])
        assert decoded["command"] == "pad"


def test_dev_stdout_redirected_to_a_file_is_written_there(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        p = subprocess.run(
            [sys.executable, "-m", "starvecheck", "pad", "--quick", "--json", "/dev/stdout"],
            env=_env(),
            cwd=tmp_path,
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert p.returncode == 0, p.stderr
    assert '"command": "pad"' in out.read_text()


def test_mode_comes_from_the_umask_at_start_up(tmp_path: Path, monkeypatch) -> None:
    """The user's code (or a thread) sets umask 0o777 while the command runs: the report
    is still readable, with the mode the umask at start-up gives."""
    target = tmp_path / "r.json"
    _swap_before_writing(monkeypatch, lambda: os.umask(0o777))
    start = outputs.STARTUP_UMASK
    try:
        r = run("pad", "--quick", "--json", str(target))
    finally:
        os.umask(start)
    assert r.exit_code == 0, r.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~start


def test_an_existing_report_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    target.write_text("old\n")
    target.chmod(0o600)
    r = run("pad", "--quick", "--json", str(target))
    assert r.exit_code == 0, r.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert json.loads(target.read_text())["command"] == "pad"


def test_a_failed_write_removes_the_temporary_file(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "r.json"

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", full)
    err = one_line(run("pad", "--quick", "--json", str(target)))
    assert err.endswith(f"--json {target}: cannot write it: No space left on device\n"), err
    assert _leftovers(tmp_path, set()) == []


def test_ctrl_c_while_writing_removes_the_temporary_file(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "r.json"
    target.write_text("old report\n")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs.os, "fsync", interrupted)
    r = run("pad", "--quick", "--json", str(target))
    assert r.exit_code == 130, r.stderr
    assert r.stderr == "starvecheck: error: interrupted\n"
    assert target.read_text() == "old report\n"
    assert _leftovers(tmp_path, {"r.json"}) == []


@pytest.mark.slow  # matplotlib's import and drawing: seconds
def test_a_plot_goes_through_the_same_writer(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    target = tmp_path / "p.png"
    from starvecheck.render import plot

    real = plot._pyplot
    calls = []

    def swapping():
        calls.append(1)
        if len(calls) == 2:  # the second is _save's, after the figure is drawn
            target.symlink_to(victim)
        return real()

    monkeypatch.setattr(plot, "_pyplot", swapping)
    err = one_line(run("pad", "--quick", "--plot", str(target)))
    assert err.endswith(f"--plot {target}: a symbolic link: {NO_LINK}\n"), err
    assert victim.read_text() == VICTIM_TEXT
    assert target.is_symlink()


def test_a_reader_that_takes_nothing_ends_in_one_line(tmp_path: Path, monkeypatch) -> None:
    """A FIFO whose reader opened it and never reads: the write gives up after IDLE_S
    (1 s here, 60 by default) instead of waiting for ever once the pipe is full."""
    import fcntl

    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads
    try:
        fcntl.fcntl(held, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
        monkeypatch.setattr(outputs, "IDLE_S", 1.0)
        r = run("env", "--json", str(fifo))
    finally:
        os.close(held)
    err = one_line(r)
    assert err.endswith(f"--json {fifo}: cannot write it: nothing read it for 1 s\n"), err
