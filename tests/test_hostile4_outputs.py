"""The fourth hostile sweep, outputs and numbers (issue 48, items 1, 4 and 6), tried as
an attacker would: links planted, swapped and dangling, FIFOs and sockets, devices,
read-only and immutable directories, a directory that vanishes, names with control
characters, one file under two names, another user's file in a sticky directory, umask
games; nan, inf and their kin in every float option, ranks written in digits that are
not ASCII, terminals 1 to 30 columns wide.

Each case asserts: no traceback, no hang (a subprocess under a timeout, in its own
process group), the exit status expected, no file touched outside starvecheck's own
(the victims' bytes and mtime), no temporary file left, no process left."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from starvecheck.core import outputs
from tests.conftest import group_alive, one_line, run, source_env
from tests.test_hostile import NOBODY, nobody_cannot_run_starvecheck
from tests.test_strict_numbers import FLOATS, REQUIRED

SC = [sys.executable, "-m", "starvecheck"]
TIMEOUT_S = 60
SECRET = "victim: must never change\n"
NO_LINK = "starvecheck writes through no link; name the file itself"


@dataclass
class Plan:
    """One case: what to run, what to expect, what must not change."""

    argv: list[str]
    rc: int | tuple[int, ...] = 0
    stderr: str | None = None  # a piece the one line must hold (rc 2)
    victims: list[Path] = field(default_factory=list)
    check: Callable[[subprocess.CompletedProcess], None] | None = None
    as_nobody: bool = False
    umask: int | None = None
    stdout_to: Path | None = None
    during: Callable[[], Callable[[], None]] | None = None  # starts a race, returns stop


def _victim(where: Path, name: str = "victim") -> Path:
    v = where / name
    v.write_text(SECRET)
    os.utime(v, ns=(1_000_000_000, 1_000_000_000))
    return v


def _shared(tmp: Path) -> Path:
    d = tmp / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


def _is_report(path: Path) -> Callable[[subprocess.CompletedProcess], None]:
    def check(p: subprocess.CompletedProcess) -> None:
        assert path.is_file() and not path.is_symlink()
        assert json.loads(path.read_text())["command"] == "env"

    return check


# ---------------------------------------------------------------- links


def link_to_victim_json(tmp: Path) -> Plan:
    v = _victim(tmp)
    (tmp / "r.json").symlink_to(v)
    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 2, NO_LINK, [v])


def link_to_victim_markdown(tmp: Path) -> Plan:
    v = _victim(tmp)
    (tmp / "r.md").symlink_to(v)
    return Plan([*SC, "env", "--markdown", str(tmp / "r.md")], 2, NO_LINK, [v])


def relative_link_to_victim(tmp: Path) -> Plan:
    v = _victim(tmp)
    d = tmp / "out"
    d.mkdir()
    (d / "r.json").symlink_to("../victim")
    return Plan([*SC, "env", "--json", "out/r.json"], 2, NO_LINK, [v])


def chain_of_links_to_victim(tmp: Path) -> Plan:
    v = _victim(tmp)
    (tmp / "l1").symlink_to(v)
    (tmp / "r.json").symlink_to(tmp / "l1")
    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 2, NO_LINK, [v])


def dangling_link(tmp: Path) -> Plan:
    (tmp / "r.json").symlink_to(tmp / "created-elsewhere")

    def check(p: subprocess.CompletedProcess) -> None:
        assert not (tmp / "created-elsewhere").exists()

    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 2, "a symbolic link to nothing",
                check=check)  # fmt: skip


def dangling_link_into_root_only_dir(tmp: Path) -> Plan:
    closed = tmp / "closed"
    closed.mkdir(mode=0o700)
    (tmp / "r.json").symlink_to(closed / "planted")

    def check(p: subprocess.CompletedProcess) -> None:
        assert list(closed.iterdir()) == []

    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 2, "symbolic link", check=check)


def link_to_directory(tmp: Path) -> Plan:
    (tmp / "d").mkdir()
    (tmp / "r.json").symlink_to(tmp / "d")
    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 2)


def link_loop(tmp: Path) -> Plan:
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return Plan([*SC, "env", "--json", str(tmp / "a")], 2)


def link_named_with_control_characters(tmp: Path) -> Plan:
    v = _victim(tmp)
    name = tmp / "r\x1b[31m\n.json"
    name.symlink_to(v)

    def check(p: subprocess.CompletedProcess) -> None:
        assert "\x1b" not in p.stderr and "\\x1b" in p.stderr

    return Plan([*SC, "env", "--json", str(name)], 2, NO_LINK, [v], check)


def link_swapped_back_and_forth_during_the_run(tmp: Path) -> Plan:
    """Another user's loop: r.json a file, then a link to the victim, as fast as it can."""
    v = _victim(tmp)
    d = _shared(tmp)
    target = d / "r.json"
    target.write_text("bait\n")

    def race() -> Callable[[], None]:
        stop = threading.Event()

        def loop() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                spare = d / f"spare{i % 2}"
                with_link = i % 2 == 0
                try:
                    if with_link:
                        spare.symlink_to(v)
                    else:
                        spare.write_text("bait\n")
                    os.rename(spare, target)
                except OSError:
                    pass

        t = threading.Thread(target=loop, daemon=True)
        t.start()

        def end() -> None:
            stop.set()
            t.join()
            for s in d.glob("spare*"):
                s.unlink()

        return end

    def check(p: subprocess.CompletedProcess) -> None:
        assert not list(d.glob(".*starvecheck*")), list(d.iterdir())

    return Plan([*SC, "env", "--json", str(target)], (0, 2), None, [v], check, during=race)


# ---------------------------------------------------------------- FIFOs, sockets, devices


def fifo_without_reader_json(tmp: Path) -> Plan:
    os.mkfifo(tmp / "r.json")
    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 2, "no process reads it")


def fifo_without_reader_markdown(tmp: Path) -> Plan:
    os.mkfifo(tmp / "r.md")
    return Plan([*SC, "env", "--markdown", str(tmp / "r.md")], 2, "no process reads it")


def link_to_fifo_without_reader(tmp: Path) -> Plan:
    os.mkfifo(tmp / "fifo")
    (tmp / "r.json").symlink_to(tmp / "fifo")
    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 2, "no process reads it")


def fifo_with_a_reader(tmp: Path) -> Plan:
    fifo = tmp / "r.json"
    os.mkfifo(fifo)
    got: list[str] = []

    def reader() -> Callable[[], None]:
        def read() -> None:
            with open(fifo) as f:
                got.append(f.read())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        return lambda: t.join(30)

    def check(p: subprocess.CompletedProcess) -> None:
        assert got and json.loads(got[0])["command"] == "env"

    return Plan([*SC, "env", "--json", str(fifo)], 0, check=check, during=reader)


def unix_socket(tmp: Path) -> Plan:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp / "r.json"))
    s.close()  # the socket file stays
    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 2, "no process reads it")


def listening_unix_socket(tmp: Path) -> Plan:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp / "r.md"))
    s.listen(1)

    def keep() -> Callable[[], None]:
        return s.close

    return Plan([*SC, "env", "--markdown", str(tmp / "r.md")], 2, "cannot write it",
                during=keep)  # fmt: skip


def dev_full(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--json", "/dev/full"], 2, "No space left on device")


def dev_null_both(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--json", "/dev/null", "--markdown", "/dev/null"], 2,
                "are the same file")  # fmt: skip


def dev_null(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--markdown", "/dev/null"], 0)


def dev_stdout_to_a_pipe(tmp: Path) -> Plan:
    def check(p: subprocess.CompletedProcess) -> None:
        assert '"command": "env"' in p.stdout

    return Plan([*SC, "env", "--json", "/dev/stdout"], 0, check=check)


def dev_stdout_to_a_file(tmp: Path) -> Plan:
    out = tmp / "out.txt"

    def check(p: subprocess.CompletedProcess) -> None:
        assert '"command": "env"' in out.read_text()

    return Plan([*SC, "env", "--json", "/dev/stdout"], 0, check=check, stdout_to=out)


def proc_self_fd_1(tmp: Path) -> Plan:
    def check(p: subprocess.CompletedProcess) -> None:
        assert "# starvecheck env" in p.stdout or "starvecheck env" in p.stdout

    return Plan([*SC, "env", "--markdown", "/proc/self/fd/1"], 0, check=check)


def dev_stderr(tmp: Path) -> Plan:
    def check(p: subprocess.CompletedProcess) -> None:
        assert '"command": "env"' in p.stderr

    return Plan([*SC, "env", "--json", "/dev/stderr"], 0, check=check)


def block_device_node(tmp: Path) -> Plan:
    node = tmp / "r.json"
    try:
        os.mknod(node, 0o600 | stat.S_IFBLK, os.makedev(7, 250))
    except OSError as e:
        pytest.skip(f"cannot make a block device node here: {e}")
    return Plan([*SC, "env", "--json", str(node)], 2, "a block device")


def char_device_node_of_dev_zero(tmp: Path) -> Plan:
    node = tmp / "zero"
    try:
        os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    except OSError as e:
        pytest.skip(f"cannot make a device node here: {e}")
    return Plan([*SC, "env", "--json", str(node)], 0)


# ---------------------------------------------------------------- directories, names, owners


def directory_as_output(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--json", f"{tmp}/"], 2, "is a directory")


def missing_directory(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--json", str(tmp / "no" / "r.json")], 2, "does not exist")


def name_too_long(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--json", str(tmp / ("x" * 300))], 2)


def empty_name(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--json", ""], 2, "needs a path")


def name_with_control_characters(tmp: Path) -> Plan:
    name = tmp / "r\x1b]0;pwned\x07\t.json"
    return Plan([*SC, "env", "--json", str(name)], 0, check=_is_report(name))


def name_starting_with_a_dash(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--json", "./-r.json"], 0, check=_is_report(tmp / "-r.json"))


def one_file_under_two_names_hard_link(tmp: Path) -> Plan:
    (tmp / "a.json").write_text("")
    os.link(tmp / "a.json", tmp / "b.md")
    return Plan([*SC, "env", "--json", str(tmp / "a.json"), "--markdown", str(tmp / "b.md")], 2,
                "are the same file")  # fmt: skip


def one_file_under_two_names_dot_dot(tmp: Path) -> Plan:
    (tmp / "d").mkdir()
    return Plan([*SC, "env", "--json", str(tmp / "r"), "--markdown", str(tmp / "d" / ".." / "r")],
                2, "are the same file")  # fmt: skip


def hard_link_to_victim_is_replaced_not_written_through(tmp: Path) -> Plan:
    v = _victim(tmp)
    os.link(v, tmp / "r.json")
    return Plan([*SC, "env", "--json", str(tmp / "r.json")], 0, None, [v],
                _is_report(tmp / "r.json"))  # fmt: skip


def foreign_file_in_sticky_directory(tmp: Path) -> Plan:
    d = _shared(tmp)
    bait = _victim(d, "r.json")
    os.chown(bait, 65534, 65534)
    if os.geteuid() != 0:
        pytest.skip("needs root to own a file as another user")
    return Plan([*SC, "env", "--json", str(bait)], 2, "an existing file of another user", [bait])


def new_file_in_sticky_directory(tmp: Path) -> Plan:
    d = _shared(tmp)
    return Plan([*SC, "env", "--json", str(d / "r.json")], 0, check=_is_report(d / "r.json"))


def immutable_directory_existing_file(tmp: Path) -> Plan:
    d = tmp / "imm"
    d.mkdir()
    (d / "r.json").write_text("old\n")
    if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")

    def check(p: subprocess.CompletedProcess) -> None:
        subprocess.run(["chattr", "-i", str(d)], check=True)
        _is_report(d / "r.json")(p)
        assert sorted(x.name for x in d.iterdir()) == ["r.json"]

    return Plan([*SC, "env", "--json", str(d / "r.json")], 0, check=check)


def nobody_new_file_in_a_read_only_directory(tmp: Path) -> Plan:
    d = tmp / "ro"
    d.mkdir(mode=0o755)
    return Plan([*SC, "env", "--json", str(d / "r.json")], 2, "not writable", as_nobody=True)


def nobody_own_file_in_a_read_only_directory(tmp: Path) -> Plan:
    d = tmp / "ro"
    d.mkdir(mode=0o755)
    (d / "r.json").write_text("old\n")
    os.chown(d / "r.json", 65534, 65534)

    def check(p: subprocess.CompletedProcess) -> None:
        _is_report(d / "r.json")(p)
        assert sorted(x.name for x in d.iterdir()) == ["r.json"]

    return Plan([*SC, "env", "--json", str(d / "r.json")], 0, check=check, as_nobody=True)


def nobody_link_to_root_file(tmp: Path) -> Plan:
    d = _shared(tmp)
    v = _victim(tmp)
    v.chmod(0o666)  # writable by all: only the link check stands between
    (d / "r.json").symlink_to(v)
    return Plan([*SC, "env", "--json", str(d / "r.json")], 2, NO_LINK, [v], as_nobody=True)


def _mode_is(path: Path, mode: int) -> Callable[[subprocess.CompletedProcess], None]:
    def check(p: subprocess.CompletedProcess) -> None:
        assert stat.S_IMODE(path.stat().st_mode) == mode, oct(path.stat().st_mode)

    return check


def umask_077(tmp: Path) -> Plan:
    r = tmp / "r.json"
    return Plan([*SC, "env", "--json", str(r)], 0, check=_mode_is(r, 0o600), umask=0o077)


def umask_000(tmp: Path) -> Plan:
    r = tmp / "r.json"
    return Plan([*SC, "env", "--json", str(r)], 0, check=_mode_is(r, 0o666), umask=0)


def umask_027_markdown(tmp: Path) -> Plan:
    r = tmp / "r.md"
    return Plan([*SC, "env", "--markdown", str(r)], 0, check=_mode_is(r, 0o640), umask=0o027)


def existing_mode_kept(tmp: Path) -> Plan:
    (tmp / "r.json").write_text("")
    (tmp / "r.json").chmod(0o604)
    return Plan(
        [*SC, "env", "--json", str(tmp / "r.json")], 0, check=_mode_is(tmp / "r.json", 0o604)
    )


def proc_file_as_output(tmp: Path) -> Plan:
    return Plan([*SC, "env", "--json", "/proc/self/environ"], 2)


# --plot: pad draws with matplotlib (seconds), so these run in the slow lane.


def plot_to_fifo_without_reader(tmp: Path) -> Plan:
    os.mkfifo(tmp / "p.png")
    return Plan([*SC, "pad", "--quick", "--plot", str(tmp / "p.png")], 2, "no process reads it")


def plot_to_link_to_victim(tmp: Path) -> Plan:
    v = _victim(tmp)
    (tmp / "p.png").symlink_to(v)
    return Plan([*SC, "pad", "--quick", "--plot", str(tmp / "p.png")], 2, NO_LINK, [v])


def plot_to_dev_full(tmp: Path) -> Plan:
    return Plan([*SC, "pad", "--quick", "--plot", "/dev/full"], 2, "No space left on device")


def plot_over_hard_link_to_victim(tmp: Path) -> Plan:
    v = _victim(tmp)
    os.link(v, tmp / "p.png")

    def check(p: subprocess.CompletedProcess) -> None:
        assert (tmp / "p.png").read_bytes().startswith(b"\x89PNG")

    return Plan([*SC, "pad", "--quick", "--plot", str(tmp / "p.png")], 0, None, [v], check)


PLOTS = (plot_to_fifo_without_reader, plot_to_link_to_victim, plot_to_dev_full,
         plot_over_hard_link_to_victim)  # fmt: skip


CASES: dict[str, Callable[[Path], Plan]] = {
    f.__name__: f
    for f in (
        link_to_victim_json, link_to_victim_markdown, relative_link_to_victim,
        chain_of_links_to_victim, dangling_link, dangling_link_into_root_only_dir,
        link_to_directory, link_loop, link_named_with_control_characters,
        link_swapped_back_and_forth_during_the_run, fifo_without_reader_json,
        fifo_without_reader_markdown, link_to_fifo_without_reader, fifo_with_a_reader,
        unix_socket, listening_unix_socket, dev_full, dev_null_both, dev_null,
        dev_stdout_to_a_pipe, dev_stdout_to_a_file, proc_self_fd_1, dev_stderr,
        block_device_node, char_device_node_of_dev_zero, directory_as_output,
        missing_directory, name_too_long, empty_name, name_with_control_characters,
        name_starting_with_a_dash, one_file_under_two_names_hard_link,
        one_file_under_two_names_dot_dot, hard_link_to_victim_is_replaced_not_written_through,
        foreign_file_in_sticky_directory, new_file_in_sticky_directory,
        immutable_directory_existing_file, nobody_new_file_in_a_read_only_directory,
        nobody_own_file_in_a_read_only_directory, nobody_link_to_root_file, umask_077,
        umask_000, umask_027_markdown, existing_mode_kept, proc_file_as_output, *PLOTS,
    )
}  # fmt: skip


def _snapshot(paths: list[Path]) -> list[tuple[bytes, int]]:
    return [(p.read_bytes(), p.stat().st_mtime_ns) for p in paths]


def _temporaries(top: Path) -> list[str]:
    found = []
    for root, dirs, files in os.walk(top):
        found += [os.path.join(root, n) for n in files + dirs if ".starvecheck-" in n]
    return found


@pytest.fixture
def sweep_dir() -> Path:
    """Under /tmp, open to uid 65534 (pytest's own are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="sc-hostile4-"))
    top.chmod(0o755)
    yield top
    subprocess.run(["chattr", "-R", "-i", str(top)], capture_output=True)
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if CASES[n] in PLOTS else n for n in CASES],
)
def test_output(name: str, sweep_dir: Path) -> None:
    play(name, CASES[name](sweep_dir), sweep_dir)


def play(name: str, plan: Plan, sweep_dir: Path) -> None:
    """Run one case's command and check all the module docstring says (also for
    tests/test_hostile5_outputs.py)."""
    argv = plan.argv
    if plan.as_nobody:
        if why := nobody_cannot_run_starvecheck():
            pytest.skip(why)
        argv = [*NOBODY, *argv]
    before = _snapshot(plan.victims)
    mask = plan.umask

    def preexec() -> None:
        if mask is not None:
            os.umask(mask)

    env = source_env(STARVECHECK_DEBUG="", COLUMNS="100")
    stop = plan.during() if plan.during else None
    out = open(plan.stdout_to, "w") if plan.stdout_to else subprocess.PIPE  # noqa: SIM115
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=sweep_dir, env=env, stdout=out, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=preexec)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{name}: still running after {TIMEOUT_S} s")
    finally:
        if stop:
            stop()
        if plan.stdout_to:
            out.close()  # type: ignore[union-attr]
    p = subprocess.CompletedProcess(argv, proc.returncode, stdout or "", stderr)
    expected = plan.rc if isinstance(plan.rc, tuple) else (plan.rc,)
    assert p.returncode in expected, (name, p.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    if p.returncode == 2:
        assert stderr.count("\n") == 1 and stderr.startswith("starvecheck: error: "), stderr
        if plan.stderr:
            assert plan.stderr in stderr, stderr
    assert time.monotonic() - started < TIMEOUT_S
    assert _snapshot(plan.victims) == before, f"{name}: a victim changed"
    assert _temporaries(sweep_dir) == []
    assert group_alive(proc.pid) == []
    if plan.check:
        plan.check(p)


# ---------------------------------------------------------------- in the process


def test_output_mode_whatever_a_thread_sets_the_umask_to(tmp_path: Path) -> None:
    """A thread (the user's prefetcher, say) sets umask 0o777 every millisecond."""
    stop = threading.Event()
    start = outputs.STARTUP_UMASK

    def games() -> None:
        while not stop.is_set():
            os.umask(0o777)
            time.sleep(0.001)

    t = threading.Thread(target=games, daemon=True)
    t.start()
    try:
        r = run("env", "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"))
    finally:
        stop.set()
        t.join()
        os.umask(start)
    assert r.exit_code == 0, r.stderr
    for name in ("r.json", "r.md"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~start


def test_output_directory_that_vanishes_before_the_write(tmp_path: Path, monkeypatch) -> None:
    from starvecheck.render import json as json_export

    d = tmp_path / "gone"
    d.mkdir()
    real = json_export.serialize

    def vanish(report):
        d.rmdir()
        return real(report)

    monkeypatch.setattr(json_export, "serialize", vanish)
    err = one_line(run("env", "--json", str(d / "r.json")))
    assert "cannot write it: No such file or directory" in err
    assert not d.exists()


def test_output_directory_replaced_by_a_link_before_the_write(tmp_path: Path, monkeypatch) -> None:
    """The directory named is swapped for a link to another: the report goes where the
    name leads now (a directory component is followed, as every tool does), never
    through a link as the last component, and the other directory's files stay."""
    from starvecheck.render import json as json_export

    d, elsewhere = tmp_path / "d", tmp_path / "elsewhere"
    d.mkdir()
    elsewhere.mkdir()
    v = _victim(elsewhere, "r.json")
    os.link(v, tmp_path / "victim-twin")
    before = _snapshot([tmp_path / "victim-twin"])
    real = json_export.serialize

    def swap(report):
        d.rmdir()
        d.symlink_to(elsewhere)
        return real(report)

    monkeypatch.setattr(json_export, "serialize", swap)
    r = run("env", "--json", str(d / "r.json"))
    assert r.exit_code == 0, r.stderr
    assert _snapshot([tmp_path / "victim-twin"]) == before  # renamed over, not written into
    assert _temporaries(tmp_path) == []


def test_output_fsync_failing_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(outputs.os, "fsync", eio)
    err = one_line(run("env", "--json", str(tmp_path / "r.json")))
    assert "cannot write it: Input/output error" in err
    assert list(tmp_path.iterdir()) == []


def test_output_sigterm_while_writing_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    from starvecheck.core.signals import Terminated

    def killed(fd: int) -> None:
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(outputs.os, "fsync", killed)
    r = run("env", "--json", str(tmp_path / "r.json"))
    assert r.exit_code == 143 and r.stderr == "starvecheck: error: terminated by SIGTERM\n"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- numbers


ODD = ["nan", "inf", "-inf", "1e999", "-1e999", "1e308", "9" * 400, "-1e-300", "0x10", "1,5"]


@pytest.mark.parametrize("value", ODD)
@pytest.mark.parametrize("command, option", FLOATS)
def test_number_float_option(command: str, option: str, value: str) -> None:
    r = run(command, *REQUIRED.get(command, []), option, value)
    assert option in one_line(r) and r.stdout == ""


RANKS = ["²", "٣", "１", "1" * 5000, "-1", "+1", " 1", "1 ", "0x1", "1e3", "", "1_0", "\x00"]


@pytest.mark.parametrize("value", RANKS)
def test_number_rank_of_another_process(tmp_path: Path, value: str) -> None:
    from starvecheck.probe.sysroot import SysRoot
    from starvecheck.stages.attach.target import find
    from tests.test_attach_target import add_process

    add_process(tmp_path, 100, 1, ["python", "train.py"], env={"RANK": value})
    job = find(100, root=SysRoot(tmp_path))
    assert [(r.pid, r.rank) for r in job.ranks] == [(100, None)]


@pytest.mark.parametrize("value", RANKS)
def test_number_rank_of_doctor_under_torchrun(value: str) -> None:
    err = one_line(run("doctor", "--quick", env={"RANK": value, "WORLD_SIZE": "2"}))
    assert "expected 0 <= RANK < WORLD_SIZE" in err


@pytest.mark.parametrize("value", ["²:5", "1,٣:5", "1:nan", "1:inf", "1:1e999", "1:-0", "+1:5"])
def test_number_slow_ranks_hook(value: str) -> None:
    from starvecheck.cli.ranks import slow_ms
    from starvecheck.core.status import UsageError

    with pytest.raises(UsageError, match="expected RANKS:MS"):
        slow_ms({"STARVECHECK_SLOW_RANKS": value}, 1)


@pytest.mark.parametrize("value", ["٢", "1,²", "1" * 5000, "1_0", "+2", "0x2", "2.0", "-0"])
@pytest.mark.parametrize("command", ["starve", "io"])
def test_number_counts_option(command: str, value: str) -> None:
    option = "--workers" if command == "starve" else "--threads"
    extra = [] if command == "starve" else ["/nonexistent-but-never-read"]
    r = run(command, "--quick", option, value, *extra)
    err = one_line(r)
    assert "expected counts" in err or "no such file" in err, err


# ---------------------------------------------------------------- terminal widths


@pytest.fixture(scope="module")
def pad_report():
    from starvecheck.core.report import Report

    r = run("pad", "--quick", "--json", "-")
    assert r.exit_code == 0, r.stderr
    return Report.from_dict(r.json)


@pytest.mark.parametrize("width", range(1, 31))
def test_terminal_width(width: int, pad_report) -> None:
    from starvecheck.core.context import Context
    from starvecheck.core.text import escaped
    from starvecheck.render import facts
    from starvecheck.render.terminal import as_text

    text = as_text(pad_report, Context(stdout_isatty=False, width=width).console())
    squeezed = re.sub(r"\s+", "", text)
    shown = escaped(pad_report)
    words = [w for _, v in facts.sections(shown)[0].rows for w in v.split()]
    for f in shown.checklist:
        words += f"{f.title} {f.id} {f.evidence or ''} {f.recommendation or ''}".split()
    missing = [w for w in words if w not in squeezed]
    assert not missing, f"width {width}: dropped {missing[:10]}"
