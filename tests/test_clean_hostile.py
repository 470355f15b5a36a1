"""`starvecheck clean` against markers anyone who can write in PATH could forge: a dead
run's marker naming files outside PATH, shared memory a live process maps, stray files
named like markers or scratch directories, names holding control characters.

Every forged marker here is otherwise valid (this user's, this host and boot, a dead
pid), so only the proof of each path stands between it and the victim files, which lie
outside the scanned PATH and must survive, each refusal said."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from starvecheck.scratch import claims, inuse, leftovers
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
def where(own_tmpdir: Path) -> dict[str, Path]:
    """PATH (data), the temporary directory clean is told about (tmp), and elsewhere:
    under the test's own short temporary directory, as a socket's path must be short."""
    dirs = {k: own_tmpdir / k for k in ("data", "tmp", "elsewhere")}
    for d in dirs.values():
        d.mkdir()
    return dirs


def _clean(data: Path, tmp: Path, *more: str) -> str:
    r = run("clean", *more, str(data), env={"TMPDIR": str(tmp)})
    assert r.exit_code == 0, r.stderr
    return r.stdout


def _kept_for_retry(d: Path, out: str) -> None:
    """The directory's data is gone, its marker kept, and the output says so."""
    assert sorted(p.name for p in d.iterdir()) == [leftovers.MARKER]
    assert f"left   {d}: kept with its marker" in out


# --- multiprocessing's pymp-* ---------------------------------------------------------


def test_a_pymp_path_outside_the_temporary_directories_is_refused(where) -> None:
    victim_dir = where["elsewhere"] / "pymp-abcd1234"
    victim = _victim(victim_dir / "notes.txt")
    d = _forge(where["data"], "starvecheck-loader-a", {"pymp": str(victim_dir)})
    out = _clean(where["data"], where["tmp"])
    assert victim.read_bytes() == PRECIOUS
    assert f"left   {victim_dir}: refused: not in the temporary directory" in out
    _kept_for_retry(d, out)


def test_a_relative_pymp_path_is_refused(where, monkeypatch) -> None:
    # ../../pymp-y from the working directory clean runs in: the victim.
    cwd = where["elsewhere"] / "a" / "b"
    cwd.mkdir(parents=True)
    victim = _victim(where["elsewhere"] / "pymp-y" / "notes.txt")
    monkeypatch.chdir(cwd)
    _forge(where["data"], "starvecheck-loader-a", {"pymp": "../../pymp-y"})
    out = _clean(where["data"], where["tmp"])
    assert victim.read_bytes() == PRECIOUS
    assert "left   ../../pymp-y: refused: not an absolute path" in out


def _pymp(tmp: Path, name: str, mode: int = 0o700) -> Path:
    d = tmp / name
    d.mkdir()
    d.chmod(mode)
    return d


@pytest.mark.parametrize(
    "case",
    ["wrong name", "foreign file", "link", "subdirectory", "open mode", "foreign owner"],
)
def test_a_pymp_directory_that_is_not_multiprocessings_is_refused(where, case) -> None:
    tmp = where["tmp"]
    victim_dir = where["elsewhere"] / "kept"
    victim = _victim(victim_dir / "notes.txt")
    name = "pymp-abcd1234"
    if case == "wrong name":
        name = "pymp-x"
        _victim(_pymp(tmp, name) / "notes.txt")
    elif case == "foreign file":
        _victim(_pymp(tmp, name) / "notes.txt")
    elif case == "link":
        (tmp / name).symlink_to(victim_dir)
    elif case == "subdirectory":
        (_pymp(tmp, name) / "listener-abcdefgh").mkdir()
    elif case == "open mode":
        _victim(_pymp(tmp, name, 0o755) / "pym-12-abcdefgh")
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give a directory to another user")
        os.chown(_pymp(tmp, name), 12345, 12345)
    pymp = tmp / name
    before = sorted(str(p) for p in pymp.rglob("*")) if pymp.is_dir() else []
    d = _forge(where["data"], "starvecheck-loader-a", {"pymp": str(pymp)})
    out = _clean(where["data"], tmp)
    assert os.path.lexists(pymp) and victim.read_bytes() == PRECIOUS
    assert sorted(str(p) for p in pymp.rglob("*")) == before
    assert f"left   {pymp}: refused: " in out
    _kept_for_retry(d, out)


def _dead_listener(path: Path) -> None:
    """A socket file as a dead process leaves it: bound, then closed."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


def test_multiprocessings_own_directory_of_a_dead_run_is_removed(where) -> None:
    pymp = _pymp(where["tmp"], "pymp-abcd_123")
    _dead_listener(pymp / "listener-k2j4h5g6")
    (pymp / "pym-4242-abcdefgh").write_bytes(b"")
    d = _forge(where["data"], "starvecheck-loader-a", {"pymp": str(pymp)})
    out = _clean(where["data"], where["tmp"])
    assert f"removed {pymp}\n" in out and f"removed {d}\n" in out
    assert not pymp.exists() and not d.exists()


def test_a_pymp_directory_a_live_process_listens_in_is_left(where) -> None:
    pymp = _pymp(where["tmp"], "pymp-abcd1234")
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(pymp / "listener-abcdefgh"))
        listener.listen()
        d = _forge(where["data"], "starvecheck-loader-a", {"pymp": str(pymp)})
        out = _clean(where["data"], where["tmp"])
        assert (pymp / "listener-abcdefgh").exists()
        assert f"left   {pymp}: refused: in use: a process listens on" in out
        _kept_for_retry(d, out)
    finally:
        listener.close()
    out = _clean(where["data"], where["tmp"])  # let go of: a later clean finishes
    assert not pymp.exists() and not d.exists()


# --- Streaming's shared memory and lock files ------------------------------------------


@pytest.fixture
def prefix() -> Iterator[int]:
    """A Streaming prefix nobody uses here; its /dev/shm names are removed afterwards."""
    for p in range(987_000, 999_999):
        if not any(n.startswith(f"{p:06}_") for n in os.listdir(claims.SHM_DIR)):
            break
    yield p
    for n in os.listdir(claims.SHM_DIR):
        if n.startswith(f"{p:06}_"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(claims.SHM_DIR, n))


@pytest.fixture
def readable_proc(tmp_path: Path, monkeypatch) -> Callable[[], None]:
    """/proc as clean sees it where leases are not available, less the processes whose
    maps this test cannot read (in some sandboxes pid 1 has more capabilities than root,
    and would count as mapping every block of root's; the tests just above cover them).
    Call it to take the view again, after starting a process."""
    view = tmp_path / "proc"
    monkeypatch.setattr(inuse, "PROC", str(view))

    def take() -> None:
        if view.exists():
            shutil.rmtree(view)
        view.mkdir()
        (view / "net").symlink_to("/proc/net")
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                with open(f"/proc/{pid}/maps", "rb") as f:
                    f.read(1)
            except OSError:
                continue
            (view / pid).symlink_to(f"/proc/{pid}")

    take()
    return take


def _shm(prefix: int, name: str) -> Path:
    return _victim(Path(claims.SHM_DIR) / f"{prefix:06}_{name}")


def test_streaming_names_and_places_a_marker_makes_up_are_refused(where, prefix) -> None:
    p = f"{prefix:06}"
    shm_victim = _shm(prefix, "victim")
    lock_elsewhere = _victim(where["elsewhere"] / f"{p}_barrier_filelock")
    notes_in_tmp = _victim(where["tmp"] / f"{p}_notes.txt")
    line = {
        "streaming_prefix": prefix,
        "shm_names": ["victim", "../../tmp/x", 7],
        "filelock_root": str(where["elsewhere"]),
        "filelock_names": ["barrier_filelock"],
    }
    other = {"streaming_prefix": prefix, "filelock_root": str(where["tmp"])}
    other["filelock_names"] = ["notes.txt"]
    d = _forge(where["data"], "starvecheck-loader-a", line, other, {"rm": "/etc"})
    out = _clean(where["data"], where["tmp"])
    for victim in (shm_victim, lock_elsewhere, notes_in_tmp):
        assert victim.read_bytes() == PRECIOUS
    assert f"left   {shm_victim}: refused: not a name Streaming gives" in out
    assert f"left   /dev/shm/{p}_../../tmp/x: refused: not a name Streaming gives" in out
    assert f"left   {lock_elsewhere}: refused: not in the temporary directory" in out
    assert f"left   {notes_in_tmp}: refused: not a name Streaming gives its lock" in out
    assert 'left   {"rm": "/etc"}: refused: a marker line starvecheck does not write' in out
    _kept_for_retry(d, out)


@pytest.mark.parametrize("case", ["link", "foreign owner", "directory"])
def test_a_streaming_name_that_is_not_a_file_of_yours_is_refused(where, prefix, case) -> None:
    shm = Path(claims.SHM_DIR) / f"{prefix:06}_barrier"
    victim = _victim(where["elsewhere"] / "notes.txt")
    if case == "link":
        shm.symlink_to(victim)
    elif case == "directory":
        shm.mkdir()
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give a file to another user")
        _shm(prefix, "barrier")
        os.chown(shm, 12345, 12345)
    try:
        line = {"streaming_prefix": prefix, "shm_names": ["barrier"]}
        d = _forge(where["data"], "starvecheck-loader-a", line)
        out = _clean(where["data"], where["tmp"])
        assert os.path.lexists(shm) and victim.read_bytes() == PRECIOUS
        assert f"left   {shm}: refused: " in out
        _kept_for_retry(d, out)
    finally:
        if shm.is_dir() and not shm.is_symlink():
            shm.rmdir()


def test_shared_memory_a_live_process_maps_is_left_then_removed(where, prefix) -> None:
    p = f"{prefix:06}"
    shm = _shm(prefix, "barrier")
    lock = _victim(where["tmp"] / f"{p}_barrier_filelock")
    line = {
        "streaming_prefix": prefix,
        "shm_names": ["barrier", "locals"],
        "filelock_root": str(where["tmp"]),
        "filelock_names": ["barrier_filelock"],
    }
    d = _forge(where["data"], "starvecheck-loader-a", line)
    code = (
        "import mmap, sys; f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 0); "
        "f.close(); print('mapped', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(shm)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"mapped\n"
        out = _clean(where["data"], where["tmp"])
        assert shm.read_bytes() == PRECIOUS
        assert f"left   {shm}: refused: in use: mapped by pid {child.pid}" in out
        assert f"removed {lock}\n" in out and not lock.exists()  # not mapped: proven
        _kept_for_retry(d, out)
    finally:
        child.communicate(b"")
    # The process let go: the marker kept for it lets a later clean finish.
    out = _clean(where["data"], where["tmp"])
    assert f"removed {shm}\n" in out and not shm.exists() and not d.exists()


def test_shared_memory_this_process_maps_is_left(where, prefix) -> None:
    shm = _shm(prefix, "epoch_data")
    with open(shm, "r+b") as f, mmap.mmap(f.fileno(), 0):
        line = {"streaming_prefix": prefix, "shm_names": ["epoch_data"]}
        _forge(where["data"], "starvecheck-loader-a", line)
        out = _clean(where["data"], where["tmp"])
        assert shm.exists() and f"mapped by pid {os.getpid()}" in out


def _locals_block(prefix: int, dirs: list[str]) -> Path:
    """/dev/shm/NNNNNN_locals as Streaming packs it (prefix._pack_locals)."""
    text = "\0".join(dirs) + f"\0{prefix}"
    data = text.encode()
    path = Path(claims.SHM_DIR) / f"{prefix:06}_locals"
    path.write_bytes((4 + len(data)).to_bytes(4, sys.byteorder) + data + b"\0" * 64)
    return path


@pytest.mark.parametrize("holder", ["elsewhere", "a longer name"])
def test_a_prefix_another_dataset_holds_now_is_not_touched(where, prefix, holder) -> None:
    d = where["data"] / "starvecheck-loader-a"
    block = _shm(prefix, "barrier")
    # "a longer name": the run's path is a prefix of the holder's, not a parent of it.
    local = where["elsewhere"] / "cache" if holder == "elsewhere" else Path(f"{d}b") / "mds"
    held = _locals_block(prefix, [str(local)])
    line = {"streaming_prefix": prefix, "shm_names": ["barrier", "locals"]}
    _forge(where["data"], d.name, line)
    out = _clean(where["data"], where["tmp"])
    assert block.read_bytes() == PRECIOUS and held.exists()
    assert f"left   {block}: refused: prefix {prefix:06} is held by another dataset" in out
    _kept_for_retry(d, out)


def test_a_prefix_whose_locals_name_the_run_is_its(where, prefix) -> None:
    d = where["data"] / "starvecheck-loader-a"
    block = _shm(prefix, "barrier")
    held = _locals_block(prefix, [str(d / "mds")])
    _forge(where["data"], d.name, {"streaming_prefix": prefix, "shm_names": ["barrier", "locals"]})
    out = _clean(where["data"], where["tmp"])
    assert not block.exists() and not held.exists() and not d.exists(), out


def test_a_lock_file_a_live_process_holds_open_is_left(where, prefix) -> None:
    lock = _victim(where["tmp"] / f"{prefix:06}_cache_filelock")
    line = {"streaming_prefix": prefix, "filelock_root": str(where["tmp"])}
    line["filelock_names"] = ["cache_filelock"]
    d = _forge(where["data"], "starvecheck-loader-a", line)
    with open(lock, "rb"):
        out = _clean(where["data"], where["tmp"])
    assert lock.read_bytes() == PRECIOUS
    assert f"left   {lock}: refused: in use: another process has it open" in out
    _kept_for_retry(d, out)


def test_without_leases_a_mapped_block_is_found_in_proc(where, prefix, monkeypatch) -> None:
    monkeypatch.setattr(inuse, "lease", lambda fd: None)  # as with fs.leases-enable=0
    shm = _shm(prefix, "epoch_data")
    with open(shm, "r+b") as f, mmap.mmap(f.fileno(), 0):
        line = {"streaming_prefix": prefix, "shm_names": ["epoch_data"]}
        _forge(where["data"], "starvecheck-loader-a", line)
        out = _clean(where["data"], where["tmp"])
        assert shm.exists() and f"in use: mapped by pid {os.getpid()}" in out


def test_without_leases_a_block_an_unreadable_process_could_open_stays(
    where, prefix, monkeypatch
) -> None:
    """On the real /proc: where some process that could open the block cannot be read
    (pid 1 here, when it holds more capabilities than root), the block stays."""
    monkeypatch.setattr(inuse, "lease", lambda fd: None)
    shm = _shm(prefix, "barrier")
    if not inuse.mapped({str(shm): shm.lstat()}):
        pytest.skip("every process that could open the block can be read here")
    line = {"streaming_prefix": prefix, "shm_names": ["barrier"]}
    d = _forge(where["data"], "starvecheck-loader-a", line)
    out = _clean(where["data"], where["tmp"])
    assert shm.read_bytes() == PRECIOUS and "may map it: its memory maps cannot be read" in out
    _kept_for_retry(d, out)


def test_without_leases_a_block_no_process_maps_is_removed(
    where, prefix, monkeypatch, readable_proc
) -> None:
    monkeypatch.setattr(inuse, "lease", lambda fd: None)
    shm = _shm(prefix, "barrier")
    line = {"streaming_prefix": prefix, "shm_names": ["barrier"]}
    d = _forge(where["data"], "starvecheck-loader-a", line)
    out = _clean(where["data"], where["tmp"])
    assert f"removed {shm}\n" in out and not d.exists()


def test_a_lease_break_does_not_end_clean(tmp_path) -> None:
    """While clean holds a lease, a process opening the file makes the kernel send
    SIGIO, whose default action would end clean; the opener waits for the release."""
    f = tmp_path / "block"
    f.write_bytes(b"x")
    with inuse.quiet_lease_breaks() as leases:
        assert leases
        fd = os.open(f, os.O_RDONLY)
        try:
            if not inuse.lease(fd):
                pytest.skip("no leases here")
            code = "import sys; open(sys.argv[1]).close()"
            child = subprocess.Popen([sys.executable, "-c", code, str(f)])
            time.sleep(1.0)  # its open breaks the lease: SIGIO here, ignored
            assert child.poll() is None  # it waits for the lease
        finally:
            inuse.unlease(fd)
            os.close(fd)
        assert child.wait(timeout=60) == 0


@pytest.mark.slow
def test_the_names_match_the_installed_streaming() -> None:
    pytest.importorskip("streaming")
    from starvecheck.stages.samples import mds

    streaming = mds.load_streaming()
    assert set(streaming.shm_names) == claims.SHM_NAMES
    assert set(streaming.filelock_names) == claims.FILELOCK_NAMES


# --- the marker goes last ----------------------------------------------------------------


def test_a_directory_clean_cannot_empty_keeps_its_marker_for_a_later_clean(where) -> None:
    d = _forge(where["data"], "starvecheck-io-a")
    (d / "samples" / "deeper").mkdir(parents=True)
    (d / "samples" / "0000.bin").write_bytes(b"y")
    out = _clean(where["data"], where["tmp"])
    assert "deeper than starvecheck makes" in out
    assert sorted(p.name for p in d.rglob("*")) == [leftovers.MARKER, "deeper", "samples"]
    (d / "samples" / "deeper").rmdir()  # the user looks, and removes what was theirs
    out = _clean(where["data"], where["tmp"])
    assert f"removed {d}\n" in out and list(where["data"].iterdir()) == []


def test_dry_run_removes_nothing_and_says_the_refusals(where) -> None:
    victim = _victim(where["elsewhere"] / "pymp-abcd1234" / "notes.txt")
    d = _forge(where["data"], "starvecheck-io-a", {"pymp": str(victim.parent)})
    out = _clean(where["data"], where["tmp"], "--dry-run")
    assert f"left   {victim.parent}: refused:" in out and "would remove" not in out
    assert (d / "shard.bin").exists() and victim.exists()


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


# --- names shown escaped -------------------------------------------------------------------


def test_clean_shows_control_characters_and_odd_bytes_escaped(where) -> None:
    data = where["data"]
    d = _forge(data, "starvecheck-\x1b[31mred\nx")
    raw = os.path.join(os.fsencode(data), b"starvecheck-\xff")
    os.mkdir(raw)
    forged = {"pymp": "/tmp/pymp-\x1b]0;owned\x07"}
    _forge(data, "starvecheck-io-b", forged)
    out = _clean(data, where["tmp"])
    assert not d.exists()
    assert f"removed {data}/starvecheck-\\x1b[31mred\\nx\n" in out
    assert f"left   {data}/starvecheck-\\xff: no starvecheck marker" in out
    assert "left   /tmp/pymp-\\x1b]0;owned\\x07: refused:" in out
    assert "\x1b" not in out and "\x07" not in out and "\udcff" not in out
    assert len(out.splitlines()) == 4  # removed, two left, the kept marker


# --- the readers of /proc, fed text ------------------------------------------------------


def test_maps_paths_reads_the_file_field() -> None:
    text = (
        "7f00-7f01 rw-s 00000000 00:1a 42  /dev/shm/000001_barrier\n"
        "7f01-7f02 r-xp 00000000 08:01 7   /usr/lib/a b.so\n"
        "7f02-7f03 rw-p 00000000 00:00 0   [heap]\n"
        "7f03-7f04 rw-p 00000000 00:00 0\n"
    )
    assert inuse.maps_paths(text) == {"/dev/shm/000001_barrier", "/usr/lib/a b.so"}


def test_status_uids_and_unix_sockets() -> None:
    assert inuse.status_uids("Name:\tx\nUid:\t1000\t1000\t1000\t0\n") == {0, 1000}
    assert inuse.status_uids("Uid:\tgarbled\n") == set()
    text = (
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        "0000: 00000002 00000000 00010000 0001 01 1 /tmp/pymp-x/listener-y\n"
        "0000: 00000002 00000000 00010000 0001 01 2 @abstract\n"
        "0000: 00000002 00000000 00000000 0001 03 3\n"
    )
    assert inuse.unix_socket_paths(text) == {"/tmp/pymp-x/listener-y"}


def _proc(root: Path, pid: int, maps: str | None, uid: int) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    if maps is None:
        (d / "maps").mkdir()  # reading it fails, as another user's maps do
    else:
        (d / "maps").write_text(maps)
    (d / "status").write_text(f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def test_a_process_whose_maps_cannot_be_read_may_map_what_it_could_open(tmp_path) -> None:
    f = tmp_path / "block"
    f.write_bytes(b"x")
    f.chmod(0o600)
    st = f.lstat()
    proc = tmp_path / "proc"
    _proc(proc, 10, "", st.st_uid)
    assert inuse.mapped({str(f): st}, str(proc)) == {}
    _proc(proc, 11, None, st.st_uid + 1)  # another user: could not open a 0600 file
    assert inuse.mapped({str(f): st}, str(proc)) == {}
    _proc(proc, 12, None, st.st_uid)  # this user, maps unreadable: may map it
    assert "pid 12 may map it" in inuse.mapped({str(f): st}, str(proc))[str(f)]
    f.chmod(0o666)  # open to others: any unreadable process may map it
    assert "may map it" in inuse.mapped({str(f): f.lstat()}, str(proc))[str(f)]


def test_locals_dirs_reads_streamings_packing() -> None:
    data = b"/a/mds\0/b\x00007"
    block = (4 + len(data)).to_bytes(4, sys.byteorder) + data + b"\0" * 16
    assert claims.locals_dirs(block) == ["/a/mds", "/b"]
    assert claims.locals_dirs(b"\xff\xff\xff\x7f") is None
    assert claims.locals_dirs(b"") is None


def test_temp_dir_is_chosen_as_tempfile_chooses_it(tmp_path) -> None:
    assert claims.temp_dir({"TMPDIR": str(tmp_path)}) == str(tmp_path)
    assert claims.temp_dir({"TMPDIR": str(tmp_path / "missing")}) in ("/tmp", "/var/tmp")


# --- what starvecheck itself records passes the proofs -----------------------------------


def _recorded(tmp_path: Path, note: Callable[[], None]) -> list[object]:
    """What `note` records in a scratch directory's marker, as clean plans it."""
    from starvecheck.scratch.directory import Scratch

    with Scratch(str(tmp_path)) as s:
        note()
        owner, extras, _ = leftovers._marker(s.dir_fd())
        assert owner is not None
        x = leftovers.Leftover(s.path, owner, tuple(extras))
        return claims.plan(x, claims.temp_dir(os.environ))


def test_what_prepare_workers_records_is_provably_multiprocessings(tmp_path) -> None:
    from starvecheck.stages.dataloader.workers import prepare_workers

    (item,) = _recorded(tmp_path, prepare_workers)
    assert isinstance(item, claims.Target) and item.kind == "pymp", item


def test_what_marker_line_records_is_provably_streamings(tmp_path) -> None:
    pytest.importorskip("streaming")
    import tempfile
    import types

    from starvecheck.scratch import directory as scratch
    from starvecheck.stages.samples import mds

    streaming = mds.load_streaming()
    dataset = types.SimpleNamespace(_shm_prefix_int=987_654, _filelock_root=tempfile.gettempdir())
    items = _recorded(tmp_path, lambda: scratch.note_all(mds.marker_line(dataset, streaming)))
    assert items and all(isinstance(i, claims.Target) for i in items), items
    assert len(items) == len(streaming.shm_names) + len(streaming.filelock_names)
