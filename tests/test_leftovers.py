"""Ownership markers and `starvecheck clean`: a run killed with SIGKILL leaves its
scratch directory (and Streaming's shared memory); a later run says so, and `clean`
removes exactly that, never anything it cannot prove is a dead run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from starvecheck.scratch import leftovers
from starvecheck.scratch.directory import Scratch
from tests.conftest import group_alive, run, settled

MINE = b"my own data\n"


def _marker(directory: Path, **owner: object) -> Path:
    directory.mkdir()
    record = {**leftovers.owner_record(), **owner}
    (directory / leftovers.MARKER).write_text(json.dumps(record) + "\n")
    (directory / "shard.bin").write_bytes(b"x" * 100)
    return directory


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_scratch_directory_carries_its_marker_while_it_exists(tmp_path: Path) -> None:
    with Scratch(str(tmp_path)) as s:
        owner = json.loads((Path(s.path) / leftovers.MARKER).read_text().splitlines()[0])
        assert owner["pid"] == os.getpid() and owner["tool"] == "starvecheck"
        assert owner["start_ticks"] == leftovers.start_ticks()
        s.note({"pymp": "/tmp/pymp-x"})
        s.note({"pymp": "/tmp/pymp-x"})  # said once
        lines = (Path(s.path) / leftovers.MARKER).read_text().splitlines()
        assert len(lines) == 2
        # This process still runs: in use, not removable.
        (found,) = leftovers.scan(str(tmp_path))
        assert not found.removable and "in use" in found.why
    assert list(tmp_path.iterdir()) == []


def test_only_a_dead_runs_directory_is_removable(tmp_path: Path) -> None:
    dead = _marker(tmp_path / "starvecheck-io-dead", pid=_dead_pid())
    reused = _marker(tmp_path / "starvecheck-io-reused", pid=os.getpid(), start_ticks=1)
    alive = _marker(tmp_path / "starvecheck-io-alive")
    elsewhere = _marker(tmp_path / "starvecheck-io-elsewhere", pid=_dead_pid(), host="not-this")
    other_uid = _marker(tmp_path / "starvecheck-io-uid", pid=_dead_pid(), uid=os.getuid() + 1)
    no_marker = tmp_path / "starvecheck-io-old"
    no_marker.mkdir()
    not_ours = tmp_path / "starvecheck-io-forged"
    not_ours.mkdir()
    (not_ours / leftovers.MARKER).write_text('{"tool": "something else", "pid": 1, "uid": 0}\n')
    found = {Path(x.path).name: x for x in leftovers.scan(str(tmp_path))}
    removable = {name for name, x in found.items() if x.removable}
    # A live pid with another start time is a reused pid: the creator is gone.
    assert removable == {dead.name, reused.name}
    assert "in use" in found[alive.name].why
    assert "another host" not in found[elsewhere.name].why  # it names the host
    assert "not-this" in found[elsewhere.name].why
    assert "another owner" in found[other_uid.name].why
    assert "no starvecheck marker" in found[no_marker.name].why
    assert "no starvecheck marker" in found[not_ours.name].why


def test_clean_removes_links_not_their_targets_and_leaves_what_is_deeper(tmp_path: Path) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_bytes(MINE)
    data = tmp_path / "data"
    data.mkdir()
    d = _marker(data / "starvecheck-loader-dead", pid=_dead_pid())
    (d / "samples").mkdir()
    (d / "samples" / "0000000.bin").write_bytes(b"y")
    (d / "samples" / "link").symlink_to(mine)
    (d / "samples" / "deeper").mkdir()
    r = run("clean", str(data))
    assert r.exit_code == 0, r.stderr
    assert mine.read_bytes() == MINE
    assert not (d / "samples" / "link").exists() and not (d / "shard.bin").exists()
    # A directory two levels down is not something starvecheck makes: left, and said.
    assert (d / "samples" / "deeper").is_dir()
    assert "deeper than starvecheck makes" in r.stdout


def test_kept_data_is_not_a_killed_run(tmp_path: Path) -> None:
    with Scratch(str(tmp_path), keep=True) as s:
        pass
    marker = Path(s.path) / leftovers.MARKER
    assert json.loads(marker.read_text().splitlines()[-1]) == {"kept": True}
    # As a later run sees it, its creator gone: not reported as killed...
    lines = marker.read_text().splitlines()
    owner = {**json.loads(lines[0]), "pid": _dead_pid()}
    marker.write_text("\n".join([json.dumps(owner), *lines[1:]]) + "\n")
    (found,) = leftovers.scan(str(tmp_path))
    assert found.kept and found.removable and leftovers.dead(str(tmp_path)) == []
    # ...and still starvecheck's: `clean` removes it when asked.
    assert run("clean", str(tmp_path)).exit_code == 0
    assert list(tmp_path.iterdir()) == []


def test_clean_refuses_what_is_not_a_directory(tmp_path: Path) -> None:
    r = run("clean", str(tmp_path / "nope"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.1)


@pytest.mark.slow
def test_a_run_killed_with_sigkill_is_reported_then_cleaned(tmp_path: Path) -> None:
    data, tmp = tmp_path / "data", tmp_path / "tmp"
    data.mkdir()
    tmp.mkdir()
    mine = data / "mine.txt"
    mine.write_bytes(MINE)
    env = {**os.environ, "TMPDIR": str(tmp)}
    shm_before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "loader", "--quick", "--runs", "1", str(data)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def streaming_recorded() -> bool:
        for d in data.glob("starvecheck-loader-*"):
            marker = d / leftovers.MARKER
            if marker.exists() and "streaming_prefix" in marker.read_text():
                return True
        return False

    try:
        _wait_for(streaming_recorded)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # as the OOM killer would: nothing runs after
        proc.wait()
    # Every process of the run gone (its workers hold files in the directory until they
    # are): waited for, where a fixed 0.5 s could be outrun on a loaded machine.
    _wait_for(lambda: not group_alive(proc.pid))
    (left,) = data.glob("starvecheck-loader-*")

    r = run("io", "--samples", "200", "--runs", "1", "--no-cold", str(data))
    assert r.exit_code == 0, r.stderr
    assert f"holds 1 scratch directory of starvecheck runs that were killed ({left.name})" in (
        r.stderr
    )
    assert f"starvecheck clean {data}" in r.stderr

    # Streaming's lock files are in the run's TMPDIR: another one proves nothing there.
    elsewhere = run("clean", "--dry-run", str(data))
    assert elsewhere.exit_code == 0 and "the TMPDIR the run had" in elsewhere.stdout
    assert f"would remove {left}\n" not in elsewhere.stdout
    dry = run("clean", "--dry-run", str(data), env={"TMPDIR": str(tmp)})
    assert dry.exit_code == 0 and f"would remove {left}" in dry.stdout and left.is_dir()

    r = run("clean", str(data), env={"TMPDIR": str(tmp)})
    assert r.exit_code == 0, r.stderr
    assert f"removed {left}" in r.stdout
    assert sorted(p.name for p in data.iterdir()) == ["mine.txt"]
    assert mine.read_bytes() == MINE
    assert list(tmp.iterdir()) == []  # Streaming's lock files, multiprocessing's pymp-*
    assert settled(lambda: set(os.listdir("/dev/shm")) - shm_before) == set()


@pytest.mark.parametrize("text", ["", "not json\n", '{"tool": "starvecheck"}\n', "[1, 2]\n"])
def test_a_garbled_marker_proves_nothing(tmp_path: Path, text: str) -> None:
    d = tmp_path / "starvecheck-io-x"
    d.mkdir()
    (d / leftovers.MARKER).write_text(text)
    (found,) = leftovers.scan(str(tmp_path))
    assert not found.removable
