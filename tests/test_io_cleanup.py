"""`io` removes everything it created, and nothing else, on every way out.

Three levels:
- `starvecheck io` in a child process, interrupted by SIGINT, SIGTERM and SIGHUP
  before the scratch directory exists, while the samples are written, while they
  are flushed and while they are read;
- the CLI in this process, with a write that fails (ENOSPC) part-way, and --keep;
- `Scratch` and the signal helpers on their own: foreign files and planted
  symlinks survive cleanup, signals are held and turned into exceptions.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import starvecheck.core.signals as signals_mod
import starvecheck.scratch.directory as scratch_mod
from starvecheck.core.signals import Terminated, signals_held, signals_raise
from starvecheck.scratch import directory as scratch_module
from starvecheck.scratch.directory import Scratch
from starvecheck.stages import io as io_stage
from tests.conftest import run

# Big enough that writing takes seconds (about 2.6 s here) and measuring longer still.
SAMPLES = 20_000
SAMPLE_SIZE = 16 * 1024
SHARD_BYTES = SAMPLES * SAMPLE_SIZE
MINE = b"my own data; starvecheck must not touch it\n"
MINE_MTIME_NS = 1_600_000_000_123_456_789
# Deadlines to wait for, not figures asserted: on a loaded 2-CPU machine writing the
# 20,000 files and the shard took more than 30 s (about 2.6 s quiet).
POLL_TIMEOUT_S = 300.0
EXIT_TIMEOUT_S = 60.0


# --- helpers -----------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Everything under `root` (not root itself): type, mode, size, mtime, content hash."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("dir", st.st_mode)
            else:
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                out[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def plant_mine(directory: Path) -> Path:
    mine = directory / "mine.txt"
    mine.write_bytes(MINE)
    os.utime(mine, ns=(MINE_MTIME_NS, MINE_MTIME_NS))
    return mine


def scratch_dirs(directory: Path) -> list[Path]:
    return sorted(directory.glob("starvecheck-io-*"))


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def rchar(pid: int) -> int | None:
    """Bytes the process has read with read(2)-like calls, or None if /proc says nothing."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def wait_for(proc: subprocess.Popen, what: str, check: Callable[[], bool]) -> None:
    """Poll `check` until it holds; fail if the process exits first or time runs out."""
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while not check():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"starvecheck exited ({proc.returncode}) before {what}: {err!r}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def _samples_written(directory: Path, at_least: int) -> bool:
    for d in scratch_dirs(directory):
        try:
            return len(os.listdir(d / "samples")) >= at_least
        except OSError:
            return False
    return False


def _shard_full(directory: Path) -> bool:
    for d in scratch_dirs(directory):
        try:
            return (d / "shard.bin").stat().st_size >= SHARD_BYTES
        except OSError:
            return False
    return False


def reach(point: str, proc: subprocess.Popen, directory: Path) -> None:
    """Wait until the child is at `point`.

    early:    0.05 s after the start (Python is still importing; no scratch directory)
    generate: a few hundred of the 20,000 sample files exist
    flush:    the shard has its full size, plus 0.5 s (the syncfs after writing)
    read:     the measurement is reading: rchar has grown by 64 MB since the shard was
              full (writing reads nothing: os.urandom is getrandom(2))
    """
    if point == "early":
        time.sleep(0.05)
        return
    if point == "generate":
        wait_for(proc, "300 sample files exist", lambda: _samples_written(directory, 300))
        # The signal must land during generation, not after it.
        assert not _shard_full(directory), "generation finished before the signal was sent"
        return
    wait_for(proc, "the shard is full", lambda: _shard_full(directory))
    if point == "flush":
        time.sleep(0.5)
        return
    assert point == "read"
    base = rchar(proc.pid)
    if base is None:  # no /proc/PID/io: measurement starts ~1.5 s after the shard is full
        time.sleep(2.5)
        return
    wait_for(
        proc,
        "the measurement reads",
        lambda: (rchar(proc.pid) or 0) >= base + (64 << 20),
    )


@pytest.fixture
def child() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start `starvecheck io` in a child process; kill it if the test leaves it running."""
    procs: list[subprocess.Popen] = []

    def start(directory: Path, *extra: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "starvecheck", "io", "--samples", str(SAMPLES)]
        cmd += ["--runs", "3", *extra, "--json", "-", str(directory)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("STARVECHECK_DEBUG", None)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"starvecheck did not exit within {EXIT_TIMEOUT_S} s of the signal: {err!r}")
    return proc.returncode, out.decode(), err.decode()


# --- 1, 2: a child process interrupted ------------------------------------------------

EXPECTED = {
    signal.SIGINT: (130, "starvecheck: error: interrupted"),
    signal.SIGTERM: (143, "starvecheck: error: terminated by SIGTERM"),
    signal.SIGHUP: (129, "starvecheck: error: terminated by SIGHUP"),
}


@pytest.mark.slow
@pytest.mark.parametrize("point", ["early", "generate", "flush", "read"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_leaves_nothing_behind(
    tmp_path: Path, child: Callable[..., subprocess.Popen], sig: signal.Signals, point: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    mine = plant_mine(data)
    before = snapshot(data)

    proc = child(data)
    reach(point, proc, data)
    proc.send_signal(sig)
    rc, out, err = finish(proc)

    # The one assertion that matters at every point: the directory is as it was.
    assert snapshot(data) == before
    assert mine.read_bytes() == MINE
    assert mine.stat().st_mtime_ns == MINE_MTIME_NS
    assert out == "", err  # no report for an interrupted run

    code, line = EXPECTED[sig]
    if point == "early":
        # 0.05 s in, the child is still starting (importing typer and rich; main() takes
        # over at ~0.2 s here). SIGINT raises KeyboardInterrupt there, outside main's
        # handling, and Python exits by re-raising SIGINT (rc -2, a traceback on
        # stderr); SIGTERM still has its default action until io installs its handler
        # (rc -15, silent). On a much faster machine main() may already be running; on a
        # loaded one Python may not yet have imported runpy to run `-m starvecheck`,
        # and its start-up ends with 1 and its own traceback (seen under a CPU burner).
        if sig == signal.SIGINT and rc == 1 and "Could not import runpy module" in err:
            assert err.rstrip().endswith("KeyboardInterrupt"), err
            return
        assert rc in (-sig, code), err
        if rc == code:
            assert err.splitlines() == [line]
        elif sig == signal.SIGINT:
            # Before starvecheck's own code runs (interpreter start-up), Python prints a
            # traceback or nothing; once `entry` runs, the one line. Python may still end
            # the process by SIGINT after that line (a KeyboardInterrupt re-raised at exit).
            assert err in ("", line + "\n") or err.rstrip().endswith("KeyboardInterrupt"), err
        else:
            assert err == ""
        return
    assert rc == code, err
    assert "Traceback" not in err
    assert err.splitlines() == [line]


@pytest.mark.slow
@pytest.mark.parametrize("threads", [None, "2"], ids=["default-threads", "2-threads"])
def test_sighup_during_measurement_leaves_nothing_behind(
    tmp_path: Path, child: Callable[..., subprocess.Popen], threads: str | None
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    plant_mine(data)
    before = snapshot(data)

    proc = child(data, *(["--threads", threads] if threads else []))
    reach("read", proc, data)
    if threads:  # the signal lands while reader threads run (main + 2 workers)
        wait_for(proc, "reader threads", lambda: len(os.listdir(f"/proc/{proc.pid}/task")) >= 3)
    proc.send_signal(signal.SIGHUP)
    rc, out, err = finish(proc)

    assert snapshot(data) == before
    assert out == ""
    assert rc == 129, err  # 128 + SIGHUP, as shells report it
    assert "Traceback" not in err
    assert err.splitlines() == ["starvecheck: error: terminated by SIGHUP"]


# --- 3: an error while writing, in this process ------------------------------------------


class _OsWithFailingWrite:
    """`os` as starvecheck.scratch.directory sees it (its write_all writes every sample file and
    the shard), where write fails with ENOSPC after `ok_writes` successful calls;
    everything else is the real os."""

    def __init__(self, ok_writes: int) -> None:
        self.ok_writes = ok_writes
        self.calls = 0
        self.failed = False

    def write(self, fd: int, data: Any) -> int:
        self.calls += 1
        if self.calls > self.ok_writes:
            self.failed = True
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


# Writes alternate: sample file i, then the shard. 0: the first sample file; 1: the
# shard's first write; 301: in the middle.
@pytest.mark.parametrize("ok_writes", [0, 1, 301])
def test_write_error_removes_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ok_writes: int
) -> None:
    fake_os = _OsWithFailingWrite(ok_writes)
    monkeypatch.setattr(scratch_module, "os", fake_os)
    before = open_fds()

    r = run("io", "--samples", "500", "--runs", "1", str(tmp_path))

    assert fake_os.failed  # the error really happened, during generation
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("starvecheck: error: writing test data in ")
    assert "No space left on device" in lines[0]
    assert list(tmp_path.iterdir()) == []
    assert open_fds() == before  # every descriptor closed: the shard's, the files', the dirs'


# --- 4: Scratch and the signal helpers ---------------------------------------------------


def test_cleanup_removes_only_what_it_recorded(tmp_path: Path) -> None:
    before = open_fds()
    with Scratch(str(tmp_path)) as s:
        s.mkdir("samples")
        for name, subdir in (("a.bin", ""), ("b.bin", "samples"), ("c.bin", "samples")):
            os.write(fd := s.new_file(name, subdir), b"ours")
            os.close(fd)
        root = Path(s.path)
        foreign = root / "foreign.txt"
        with open(foreign, "w") as f:
            f.write("not starvecheck's")
    assert foreign.read_text() == "not starvecheck's"
    assert root.is_dir()
    assert sorted(p.name for p in root.iterdir()) == ["foreign.txt"]  # ours gone, samples too
    assert len(s.leftovers) == 1
    assert s.leftovers[0].startswith(f"{s.path}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == [root.name]
    assert open_fds() == before


def test_cleanup_leaves_a_subdirectory_holding_a_foreign_file(tmp_path: Path) -> None:
    with Scratch(str(tmp_path)) as s:
        s.mkdir("samples")
        os.close(s.new_file("0.bin", "samples"))
        foreign = Path(s.path, "samples", "foreign.bin")
        foreign.write_bytes(b"x")
    assert foreign.read_bytes() == b"x"
    assert sorted(p.name for p in foreign.parent.iterdir()) == ["foreign.bin"]
    assert [x.split(": ")[0] for x in s.leftovers] == [str(foreign.parent), s.path]


def test_new_file_refuses_a_planted_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    os.utime(outside, ns=(MINE_MTIME_NS, MINE_MTIME_NS))
    work = tmp_path / "work"
    work.mkdir()
    with Scratch(str(work)) as s:
        link = Path(s.path, "shard.bin")
        link.symlink_to(outside)
        with pytest.raises(FileExistsError):
            s.new_file("shard.bin")
    assert outside.read_bytes() == b"precious"
    assert outside.stat().st_mtime_ns == MINE_MTIME_NS
    # The link is not starvecheck's: it stays, and so does the directory holding it.
    assert link.is_symlink() and os.readlink(link) == str(outside)
    assert [x.split(": ")[0] for x in s.leftovers] == [s.path]


def test_cleanup_unlinks_a_swapped_in_symlink_not_its_target(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    work = tmp_path / "work"
    work.mkdir()
    with Scratch(str(work)) as s:
        s.mkdir("samples")
        for subdir in ("", "samples"):
            os.close(s.new_file("x.bin", subdir))
            ours = Path(s.path, subdir, "x.bin")
            ours.unlink()
            ours.symlink_to(outside)
    assert outside.read_bytes() == b"precious"
    assert list(work.iterdir()) == []  # the names were ours: links and directories gone
    assert s.leftovers == []


@pytest.mark.parametrize("swapped", ["", "samples"], ids=["root", "subdir"])
def test_cleanup_ignores_a_directory_swapped_for_a_symlink(tmp_path: Path, swapped: str) -> None:
    """Everything is unlinked through the descriptors opened at creation: a directory
    replaced by a symlink to another with the same names sends no unlink there."""
    outside = tmp_path / "outside"
    (outside / "samples").mkdir(parents=True)
    victims = [outside / "shard.bin", outside / "samples" / "0.bin"]
    if swapped == "samples":
        victims = [outside / "0.bin"]
    for v in victims:
        v.write_bytes(b"precious")
    work = tmp_path / "work"
    work.mkdir()
    moved = tmp_path / "moved"
    with Scratch(str(work)) as s:
        s.mkdir("samples")
        os.close(s.new_file("shard.bin"))
        os.close(s.new_file("0.bin", "samples"))
        os.rename(os.path.join(s.path, swapped), moved)
        os.symlink(outside, os.path.join(s.path, swapped).rstrip("/"))
    for v in victims:
        assert v.read_bytes() == b"precious"
    assert Path(s.path, swapped).is_symlink()  # not ours: left, and reported
    assert s.leftovers
    # Our own files went, wherever the directory was moved to.
    assert not [p for p in moved.rglob("*") if p.is_file()]


def test_keep_leaves_everything_and_closes_descriptors(tmp_path: Path) -> None:
    before = open_fds()
    with Scratch(str(tmp_path), keep=True) as s:
        s.mkdir("samples")
        os.write(fd := s.new_file("0.bin", "samples"), b"kept")
        os.close(fd)
    assert Path(s.path, "samples", "0.bin").read_bytes() == b"kept"
    assert s.leftovers == []
    assert open_fds() == before


def test_a_taken_name_is_never_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = tmp_path / "starvecheck-deadbeef"
    taken.mkdir()
    (taken / "theirs.bin").write_bytes(b"theirs")
    names = iter(["deadbeef", "deadbeef", "0badf00d"])

    class FakeSecrets:
        @staticmethod
        def token_hex(n: int) -> str:
            return next(names)

    monkeypatch.setattr(scratch_mod, "secrets", FakeSecrets)
    with Scratch(str(tmp_path)) as s:
        assert s.name == "starvecheck-0badf00d"
        os.close(s.new_file("theirs.bin"))
    assert (taken / "theirs.bin").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["starvecheck-deadbeef"]


class _OsInterrupting:
    """`os` as starvecheck.scratch.directory sees it, where one call succeeds and then Ctrl-C
    arrives (a real SIGINT, delivered by Python's handler)."""

    def __init__(self, call: str, name: str | None = None) -> None:
        self.call, self.name = call, name
        self.fds: list[int] = []

    def __getattr__(self, attr: str) -> Any:
        real = getattr(os, attr)
        if attr != self.call:
            return real

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if self.name is None or args[0] == self.name:
                if isinstance(result, int):
                    self.fds.append(result)
                signal.raise_signal(signal.SIGINT)
            return result

        return wrapped


def test_ctrl_c_while_creating_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch_mod, "os", _OsInterrupting("mkdir"))
    with pytest.raises(KeyboardInterrupt), Scratch(str(tmp_path)):
        pytest.fail("the block must not run")
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_while_creating_a_subdirectory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(KeyboardInterrupt), Scratch(str(tmp_path)) as s:
        monkeypatch.setattr(scratch_mod, "os", _OsInterrupting("mkdir", "samples"))
        s.mkdir("samples")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_just_after_a_file_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name is recorded before open: an interrupt right after the open keeps it."""
    fake = _OsInterrupting("open", "0.bin")
    with pytest.raises(KeyboardInterrupt), Scratch(str(tmp_path)) as s:
        s.mkdir("samples")
        monkeypatch.setattr(scratch_mod, "os", fake)
        s.new_file("0.bin", "samples")
    for fd in fake.fds:
        os.close(fd)
    assert len(fake.fds) == 1  # the file was created
    assert list(tmp_path.iterdir()) == []


def test_signals_held_defers_ctrl_c() -> None:
    reached = False
    with pytest.raises(KeyboardInterrupt), signals_held():
        signal.raise_signal(signal.SIGINT)
        reached = True  # no KeyboardInterrupt inside the block
    assert reached
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_signals_held_delivers_the_first_signal(
    sentinel_handlers: Callable[[int, object], None],
) -> None:
    with pytest.raises(Terminated) as caught, signals_raise(), signals_held():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    assert caught.value.signum == signal.SIGTERM


@pytest.fixture
def sentinel_handlers() -> Iterator[Callable[[int, object], None]]:
    """A known handler for SIGTERM and SIGHUP, so raising them can never end pytest."""

    def sentinel(signum: int, frame: object) -> None:
        raise AssertionError(f"sentinel handler ran for {signum}")

    old = {s: signal.signal(s, sentinel) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield sentinel
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signals_raise_turns_sigterm_into_terminated(
    sentinel_handlers: Callable[[int, object], None], sig: signal.Signals
) -> None:
    with signals_raise(), pytest.raises(Terminated) as caught:
        signal.raise_signal(sig)
    assert caught.value.signum == sig
    assert str(caught.value) == sig.name
    assert not isinstance(caught.value, Exception)  # `except Exception` cannot swallow it
    assert signal.getsignal(signal.SIGTERM) is sentinel_handlers
    assert signal.getsignal(signal.SIGHUP) is sentinel_handlers


def test_signals_raise_restores_handlers_after_an_exception(
    sentinel_handlers: Callable[[int, object], None],
) -> None:
    with pytest.raises(Terminated), signals_raise():
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is sentinel_handlers
    with pytest.raises(AssertionError, match="sentinel"):
        signal.raise_signal(signal.SIGTERM)  # the old handler is really back


def test_signals_raise_keeps_an_ignored_sighup_ignored() -> None:
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    try:
        with signals_raise():
            signal.raise_signal(signal.SIGHUP)  # must be ignored, as the user asked
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


# --- 5: the CLI, success and --keep -------------------------------------------------------


def _small_io(directory: Path, *extra: str) -> Any:
    args = ["--samples", "64", "--runs", "1", "--threads", "1", *extra, "--json", "-"]
    r = run("io", *args, str(directory))
    assert r.exit_code == 0, r.stderr
    return r


def test_success_removes_the_data(tmp_path: Path) -> None:
    mine = plant_mine(tmp_path)
    before = snapshot(tmp_path)
    r = _small_io(tmp_path)
    params = r.json["stages"][0]["parameters"]
    assert Path(params["scratch"]).parent == Path(os.path.realpath(tmp_path))
    assert not Path(params["scratch"]).exists()
    assert snapshot(tmp_path) == before
    assert mine.read_bytes() == MINE
    assert r.stderr == ""


def test_keep_leaves_the_data(tmp_path: Path) -> None:
    r = _small_io(tmp_path, "--keep")
    stage = r.json["stages"][0]
    kept = Path(stage["parameters"]["scratch"])
    try:
        assert kept.parent == Path(os.path.realpath(tmp_path))
        assert kept.name.startswith("starvecheck-io-")
        assert scratch_dirs(tmp_path) == [tmp_path / kept.name]
        assert (kept / "shard.bin").stat().st_size == 64 * SAMPLE_SIZE
        assert sorted(os.listdir(kept / "samples")) == [f"{i:07d}.bin" for i in range(64)]
        assert any(str(kept) in c and "--keep" in c for c in stage["caveats"])
    finally:
        shutil.rmtree(kept, ignore_errors=True)
    assert list(tmp_path.iterdir()) == []


def test_cli_reports_and_keeps_a_foreign_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone else's file inside the scratch directory survives the run and is named
    in one warning; the run itself still succeeds."""
    real_generate = io_stage.generate
    planted: list[Path] = []

    def generate(scratch: Scratch, plan: io_stage.Plan, progress: Any = None) -> Any:
        layouts = real_generate(scratch, plan, progress or (lambda *a: None))
        theirs = Path(scratch.path, "samples", "theirs.txt")
        theirs.write_text("theirs")
        planted.append(theirs)
        return layouts

    monkeypatch.setattr(io_stage, "generate", generate)
    r = _small_io(tmp_path)
    [theirs] = planted
    scratch_dir = theirs.parent.parent
    try:
        assert theirs.read_text() == "theirs"
        assert sorted(p.name for p in scratch_dir.rglob("*")) == ["samples", "theirs.txt"]
        assert r.json["stages"][0]["parameters"]["scratch"] == str(scratch_dir)
        [line] = r.stderr.splitlines()
        assert line.startswith("starvecheck: warning: could not remove everything")
        assert f"{scratch_dir}/samples: " in line
        assert f"; {scratch_dir}: " in line
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)


def test_a_second_signal_cannot_cut_the_cleanup_short(tmp_path: Path) -> None:
    """Ctrl-C twice: the second arrives while the first unwinds, in __exit__ before the
    cleanup has begun holding signals."""

    class LateSignal(Scratch):
        def cleanup(self) -> None:
            signal.raise_signal(signal.SIGINT)  # without the guard: raises here, and
            signal.raise_signal(signal.SIGTERM)  # nothing below would run
            super().cleanup()

    scratch = LateSignal(str(tmp_path), prefix="starvecheck-io-")
    with pytest.raises(KeyboardInterrupt), signals_raise(), scratch:
        os.close(scratch.new_file("a.bin"))
        signal.raise_signal(signal.SIGINT)  # the first: raises here
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_path_keeps_its_own_times(tmp_path: Path) -> None:
    """Making and removing the scratch directory moves PATH's mtime; it is put back."""
    data = tmp_path / "data"
    data.mkdir()
    os.utime(data, ns=(1_600_000_000_000_000_000, 1_500_000_000_000_000_000))
    _small_io(data)
    st = data.stat()
    assert (st.st_atime_ns, st.st_mtime_ns) == (
        1_600_000_000_000_000_000,
        1_500_000_000_000_000_000,
    )
    assert list(data.iterdir()) == []


def test_times_are_not_restored_over_leftovers(tmp_path: Path) -> None:
    """When something foreign stays behind, PATH did change: its mtime is left alone."""
    s = Scratch(str(tmp_path), prefix="starvecheck-io-")
    os.utime(tmp_path, ns=(1_600_000_000_000_000_000, 1_500_000_000_000_000_000))
    with s:
        (Path(s.path) / "foreign").write_text("not ours")
    assert s.leftovers
    assert tmp_path.stat().st_mtime_ns != 1_500_000_000_000_000_000


def test_a_swallowed_interrupt_is_raised_again(capsys: pytest.CaptureFixture[str]) -> None:
    """Python drops an exception raised in __del__ or an at-fork callback (logging's
    runs at every DataLoader worker fork) and prints 'Exception ignored': the Ctrl-C
    would be lost and the run would go on. check_signals raises it again."""

    class Swallows:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)  # the handler raises here, inside __del__

    reached = []
    with pytest.raises(KeyboardInterrupt), signals_raise():
        Swallows()
        reached.append(True)  # the interrupt did not propagate by itself
        signals_mod.check_signals()
    assert reached == [True]
    assert "Exception ignored" not in capsys.readouterr().err
    signals_mod.check_signals()  # outside the block: nothing pending any more


def _del_failures() -> list[Any]:
    """What __del__ reports for a half-built loader iterator, and for any other object."""

    class _MultiProcessingDataLoaderIter:
        def __del__(self) -> None: ...

    class Other:
        def __del__(self) -> None: ...

    return [
        SimpleNamespace(
            exc_type=AttributeError,
            exc_value=AttributeError("_shutdown"),
            exc_traceback=None,
            err_msg=None,
            object=owner.__del__,
        )
        for owner in (_MultiProcessingDataLoaderIter, Other)
    ]


@pytest.mark.parametrize("inside", [False, True], ids=["after-the-block", "inside-the-block"])
def test_a_half_built_loader_iterator_is_quiet_after_an_interrupt(
    monkeypatch: pytest.MonkeyPatch, inside: bool
) -> None:
    """Ctrl-C inside DataLoader's iterator __init__ leaves an object whose __del__
    fails once the traceback is freed: that is dropped, whether it is freed after
    signals_raise or (the command line's block spans the whole command; a CI run
    printed it) before it is left; any other object's failure still prints."""
    printed: list[str] = []
    monkeypatch.setattr(
        sys, "unraisablehook", lambda info: printed.append(info.object.__qualname__)
    )
    failures = _del_failures()
    with pytest.raises(KeyboardInterrupt), signals_raise():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        finally:
            for info in failures if inside else ():
                sys.unraisablehook(info)
    for info in () if inside else failures:
        sys.unraisablehook(info)
    assert printed == [failures[1].object.__qualname__]
