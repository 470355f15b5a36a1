"""Outputs never reach another user (issue 58, part 3): another user's FIFO, socket,
device or link in a sticky directory is refused, before the run and again when the
report is written; a link of another user on the way to an output is refused, naming
it, where root's and our own are followed; every name and directory that can take a
report is accepted before the run (a name of 240 bytes of UTF-8, a write-only
directory), and every one that cannot is refused before it (a name over 255 bytes, a
path over PATH_MAX, a directory without x).

The other user is uid 65534, as in tests/test_hostile.py; the sticky directory is a
test's own TMPDIR (conftest.own_tmpdir: mode 1777, as /tmp)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from starvecheck.core import outputs
from tests.conftest import one_line, run, source_env
from tests.test_hostile import NOBODY, nobody_cannot_run_starvecheck

OTHER = 65534
SC = [sys.executable, "-m", "starvecheck"]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def _sticky(own_tmpdir: Path) -> Path:
    d = own_tmpdir / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


def _theirs(path: Path) -> Path:
    os.lchown(path, OTHER, OTHER)
    return path


def _refused_before_the_run(*argv: str) -> str:
    """One line, and no report: `env` prints its table once it has run."""
    r = run("env", *argv)
    err = one_line(r)
    assert r.stdout == "", r.stdout[:200]
    return err


def _held_reader(fifo: Path) -> int:
    """A reader that waits on the FIFO and never reads: what a writer sends stays."""
    return os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)


def _nothing_sent(reader: int) -> None:
    try:
        got = os.read(reader, 1 << 16)
    except BlockingIOError:
        got = b""
    finally:
        os.close(reader)
    assert got == b"", got[:200]


def _as_nobody(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    if why := nobody_cannot_run_starvecheck():
        pytest.skip(why)
    return subprocess.run([*NOBODY, *SC, *argv], cwd=cwd, env=source_env(STARVECHECK_DEBUG=""),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


# ---------------------------------------------------------------- 1. another user's files


@needs_root
def test_another_users_fifo_in_a_sticky_directory_gets_no_report(own_tmpdir: Path) -> None:
    fifo = _sticky(own_tmpdir) / "r.json"
    os.mkfifo(fifo)
    _theirs(fifo)
    reader = _held_reader(fifo)
    err = _refused_before_the_run("--json", str(fifo))
    assert f"--json {fifo}: a FIFO of another user (uid {OTHER}) in a shared sticky" in err
    _nothing_sent(reader)


@needs_root
def test_another_users_link_to_a_fifo_gets_no_report(own_tmpdir: Path) -> None:
    shared = _sticky(own_tmpdir)
    fifo = own_tmpdir / "ours"
    os.mkfifo(fifo)
    link = shared / "r.md"
    link.symlink_to(fifo)
    _theirs(link)
    reader = _held_reader(fifo)
    err = _refused_before_the_run("--markdown", str(link))
    assert f"{link} is a symbolic link of another user (uid {OTHER})" in err
    _nothing_sent(reader)


@needs_root
def test_another_users_character_device_in_a_sticky_directory_is_refused(
    own_tmpdir: Path,
) -> None:
    node = _sticky(own_tmpdir) / "r.json"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    except OSError as e:
        pytest.skip(f"cannot make a device node here: {e}")
    _theirs(node)
    err = _refused_before_the_run("--json", str(node))
    assert f"a character device of another user (uid {OTHER})" in err


@needs_root
def test_another_users_link_to_a_device_is_refused(own_tmpdir: Path) -> None:
    """/tmp/x -> /dev/kmsg, made here with a node of our own: root's report would go
    to the kernel's log, or wherever the link's owner points it next."""
    shared = _sticky(own_tmpdir)
    node = own_tmpdir / "kmsg"
    try:
        os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as e:
        pytest.skip(f"cannot make a device node here: {e}")
    link = shared / "r.json"
    link.symlink_to(node)
    _theirs(link)
    assert "is a symbolic link of another user" in _refused_before_the_run("--json", str(link))


@needs_root
def test_another_users_socket_in_a_sticky_directory_is_refused_before_the_run(
    own_tmpdir: Path,
) -> None:
    path = _sticky(own_tmpdir) / "r.json"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        s.listen(1)
        _theirs(path)
        err = _refused_before_the_run("--json", str(path))
    finally:
        s.close()
    assert f"a socket of another user (uid {OTHER}) in a shared sticky directory" in err


@needs_root
def test_another_users_fifo_planted_after_the_check_gets_no_report(
    own_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check before the run passed (no file); the other user makes a FIFO of the
    name while the report is rendered: the write refuses what it finds."""
    from starvecheck.render import json as json_export

    fifo = _sticky(own_tmpdir) / "r.json"
    readers: list[int] = []
    real = json_export.serialize

    def plant(report):
        os.mkfifo(fifo)
        _theirs(fifo)
        readers.append(_held_reader(fifo))
        return real(report)

    monkeypatch.setattr(json_export, "serialize", plant)
    err = one_line(run("env", "--json", str(fifo)))
    assert f"--json {fifo}: a FIFO of another user (uid {OTHER})" in err
    _nothing_sent(readers[0])


# ---------------------------------------------------------------- 2. links on the way


def _private(own_tmpdir: Path) -> Path:
    d = own_tmpdir / "private"
    d.mkdir(mode=0o700)
    return d


@needs_root
def test_another_users_link_on_the_way_is_refused_naming_it(own_tmpdir: Path) -> None:
    """/tmp/x -> /root/private, output /tmp/x/out: the report would land where only
    root may write."""
    private = _private(own_tmpdir)
    x = _sticky(own_tmpdir) / "x"
    x.symlink_to(private)
    _theirs(x)
    err = _refused_before_the_run("--json", str(x / "out.json"))
    assert f"--json {x}/out.json: {x} is a symbolic link of another user (uid {OTHER})" in err
    assert list(private.iterdir()) == []


@needs_root
def test_another_users_link_through_dot_dot_is_refused(own_tmpdir: Path, monkeypatch) -> None:
    private = _private(own_tmpdir)
    (private / "inner").mkdir()
    shared = _sticky(own_tmpdir)
    x = shared / "x"
    x.symlink_to(private / "inner")
    _theirs(x)
    monkeypatch.chdir(shared)
    assert "x is a symbolic link of another user" in _refused_before_the_run(
        "--json", "x/../out.json"
    )
    assert list(private.iterdir()) == [private / "inner"]


@needs_root
def test_a_directory_swapped_for_another_users_link_before_the_write_is_refused(
    own_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starvecheck.render import json as json_export

    private = _private(own_tmpdir)
    d = _sticky(own_tmpdir) / "d"
    d.mkdir()
    os.chown(d, OTHER, OTHER)  # theirs, so they may swap it
    real = json_export.serialize

    def swap(report):
        d.rmdir()
        d.symlink_to(private)
        _theirs(d)
        return real(report)

    monkeypatch.setattr(json_export, "serialize", swap)
    err = one_line(run("env", "--json", str(d / "r.json")))
    assert f"{d} is a symbolic link of another user" in err
    assert list(private.iterdir()) == []


def test_root_and_our_own_links_on_the_way_are_followed(own_tmpdir: Path) -> None:
    """/var/run -> /run: a link of root's (or our own) is no one else's to point."""
    real = own_tmpdir / "real"
    real.mkdir()
    (own_tmpdir / "run").symlink_to("real")
    (own_tmpdir / "abs").symlink_to(real)
    for via in ("run", "abs"):
        r = run("env", "--json", str(own_tmpdir / via / f"{via}.json"))
        assert r.exit_code == 0, r.stderr
        assert (real / f"{via}.json").is_file()


def test_a_loop_of_links_on_the_way_is_one_line(own_tmpdir: Path) -> None:
    (own_tmpdir / "a").symlink_to("b")
    (own_tmpdir / "b").symlink_to("a")
    err = _refused_before_the_run("--json", str(own_tmpdir / "a" / "r.json"))
    assert "too many levels of symbolic links" in err


# ---------------------------------------------------------------- 3. what can be written


@pytest.mark.parametrize("name", ["é" * 120 + ".json", "𝄞" * 61 + ".json", "x" * 255])
def test_a_long_name_that_fits_is_written(own_tmpdir: Path, name: str) -> None:
    """245 and 249 bytes of UTF-8, 255 of ASCII: the temporary name is cut to fit."""
    r = run("env", "--json", str(own_tmpdir / name))
    assert r.exit_code == 0, r.stderr
    assert [p.name for p in own_tmpdir.iterdir()] == [name]


def test_the_temporary_name_fits_and_never_splits_a_character() -> None:
    fd = os.open("/", os.O_PATH)
    try:
        for name in ("é" * 127, "𝄞" * 63 + "abc", "a" + "€" * 84, "r.json", "x" * 255):
            temp = outputs._temporary(name, fd)
            raw = temp.encode("utf-8")  # a split character would not encode back
            assert len(raw) <= 255 and temp.startswith("." + name[:1]), temp
            assert ".starvecheck-" in temp and temp.endswith(".tmp")
    finally:
        os.close(fd)


def test_a_name_over_255_bytes_is_refused_before_the_run_saying_its_length(
    own_tmpdir: Path,
) -> None:
    err = _refused_before_the_run("--json", str(own_tmpdir / ("é" * 128 + ".json")))
    assert "a name of 261 bytes: a file name is at most 255 bytes" in err


def test_a_path_over_path_max_is_refused_before_the_run_saying_its_length(
    own_tmpdir: Path,
) -> None:
    path = str(own_tmpdir) + "/a" * 2100 + "/r.json"
    err = _refused_before_the_run("--json", path)
    assert f"a path of {len(path.encode())} bytes: Linux takes at most 4095" in err


def test_a_write_only_directory_takes_the_report(own_tmpdir: Path) -> None:
    d = own_tmpdir / "wx"
    d.mkdir()
    os.chown(d, OTHER, OTHER)
    d.chmod(0o300)
    p = _as_nobody(["env", "--json", str(d / "r.json")], own_tmpdir)
    assert p.returncode == 0, p.stderr
    d.chmod(0o700)
    assert [x.name for x in d.iterdir()] == ["r.json"]


def test_a_directory_without_search_permission_is_refused_before_the_run(
    own_tmpdir: Path,
) -> None:
    d = own_tmpdir / "w"
    d.mkdir()
    os.chown(d, OTHER, OTHER)
    d.chmod(0o200)
    p = _as_nobody(["env", "--json", str(d / "r.json")], own_tmpdir)
    assert p.returncode == 2 and p.stdout == "", (p.stdout[:200], p.stderr)
    assert p.stderr.count("\n") == 1
    assert f"not writable: directory {d} cannot be searched (no x permission)" in p.stderr


def test_the_walk_leaves_no_descriptor_open(own_tmpdir: Path) -> None:
    """Every way a walk ends (core/walk.py): found, through links of each kind, or
    stopped by a loop, a missing directory, a file on the way, a link of another user."""
    from starvecheck.core import walk

    (own_tmpdir / "real").mkdir()
    (own_tmpdir / "rel").symlink_to("real")
    (own_tmpdir / "abs").symlink_to(own_tmpdir / "real")
    (own_tmpdir / "loop").symlink_to("loop")
    (own_tmpdir / "file").write_text("")
    paths = ["rel/r.json", "abs/r.json", "rel", "loop/r.json", "no/r.json", "file/r.json",
             "/dev/stdout", "/proc/self/fd/1", "/proc/self/cwd/r.json", "../x", "/"]  # fmt: skip
    if os.geteuid() == 0:
        x = _sticky(own_tmpdir) / "x"
        x.symlink_to("../real")
        _theirs(x)
        paths.append("shared/x/r.json")
    before = sorted(os.listdir("/proc/self/fd"))
    cwd = os.getcwd()
    os.chdir(own_tmpdir)
    try:
        for path in paths * 3:
            with contextlib.suppress(OSError, walk.Foreign, walk.Dangling):
                walk.place(path).close()
    finally:
        os.chdir(cwd)
    assert sorted(os.listdir("/proc/self/fd")) == before
