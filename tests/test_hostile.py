"""Hostile input and environment: each case one line on stderr and exit 2 (never a
traceback, never 70), or, where the input is fine, the answer."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, deny_access, one_line, run

TRACE = FIXTURES / "traces" / "gpu.json.gz"
SC = [sys.executable, "-m", "starvecheck"]


@pytest.mark.parametrize(
    "option, value",
    [
        ("--step-ms", "0"),
        ("--step-ms", "nan"),
        ("--step-ms", "inf"),
        ("--step-ms", "-5"),
        ("--sample-ms", "nan"),
        ("--sample-ms", "1e400"),
    ],
)
def test_float_options_refuse_nan_inf_and_out_of_range(option: str, value: str) -> None:
    err = one_line(run("starve", "--quick", option, value, "--json", "-"))
    assert f"Invalid value for '{option}'" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0.5", "601"])
def test_attach_duration_refuses_nan_inf_and_out_of_range(value: str) -> None:
    # nan passed click's own range (1 to 600), and attach ended with exit 70
    err = one_line(run("attach", str(os.getpid()), "--duration", value))
    assert "Invalid value for '--duration'" in err and "expected from 1 to 600" in err


def test_json_and_markdown_to_one_file_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "r"
    (tmp_path / "link").symlink_to(target)
    for markdown in (str(target), str(tmp_path / "." / "r"), str(tmp_path / "link")):
        err = one_line(run("env", "--json", str(target), "--markdown", markdown))
        assert "are the same file" in err
    assert not target.exists()


def test_a_closed_stdout_is_one_line() -> None:
    r = subprocess.run(
        [*SC, "env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
    )
    assert r.returncode == 0  # an open stdout: the test's control
    r = subprocess.run(
        [*SC, "env"],
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert r.returncode == 2
    assert r.stderr == "starvecheck: error: cannot write the report: standard output is closed\n"


def test_a_deleted_working_directory_is_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    r = subprocess.run(
        f"cd {gone} && rmdir {gone} && exec {sys.executable} -m starvecheck io --quick",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert r.returncode == 2
    assert r.stderr.startswith("starvecheck: error: the working directory no longer exists")
    assert r.stderr.count("\n") == 1


def test_link_loops_long_names_and_kernel_filesystems_say_what_they_are(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert "too many levels of symbolic links" in one_line(run("io", str(tmp_path / "a")))
    assert "file name too long" in one_line(run("loader", str(tmp_path / ("x" * 300))))
    for command, path in (("io", "/proc"), ("loader", "/sys/kernel"), ("doctor", "/proc/self")):
        assert "a kernel interface, not storage" in one_line(run(command, "--quick", path))


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@functools.cache
def nobody_cannot_run_starvecheck() -> str | None:
    """Why uid 65534 cannot run this checkout's starvecheck, or None if it can. A checkout
    inside a directory others cannot enter (root's 0700 home, the usual place on a fresh
    machine) is out of its reach: asked, not assumed."""
    if shutil.which("setpriv") is None:
        return "needs setpriv (util-linux)"
    if os.getuid() != 0:
        return "needs root to run as another user"
    r = subprocess.run(
        [*NOBODY, *SC, "--version"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return f"uid 65534 cannot run starvecheck from this checkout ({last})"
    return None


@pytest.mark.parametrize("command", ["io", "loader", "doctor"])
def test_a_directory_writable_but_not_readable_is_one_line(command: str) -> None:
    why = nobody_cannot_run_starvecheck()
    if why:
        pytest.skip(why)
    # Under /tmp: pytest's own temporary directories are 0700, closed to another user.
    top = Path(tempfile.mkdtemp(prefix="starvecheck-test-"))
    try:
        top.chmod(0o755)
        wo = top / "wo"
        wo.mkdir()
        wo.chmod(0o333)
        r = subprocess.run(
            [*NOBODY, *SC, command, "--quick", str(wo)],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert r.returncode == 2, r.stderr
        assert "writable but not readable" in r.stderr and r.stderr.count("\n") == 1
        assert list(wo.iterdir()) == []
    finally:
        shutil.rmtree(top)


def test_a_trace_on_standard_input_or_a_pipe_is_read() -> None:
    data = TRACE.read_bytes()
    for argv in ([*SC, "profile", "--trace", "-"], [*SC, "profile", "--trace", "/dev/stdin"]):
        r = subprocess.run([*argv, "--json", "-"], input=data, capture_output=True, check=False)
        assert r.returncode == 0, r.stderr
        assert b'"stage": "profile"' in r.stdout
    r = subprocess.run([*SC, "profile", "--trace", "-"], input=b"not a trace", capture_output=True)
    assert r.returncode == 2 and r.stderr.startswith(b"starvecheck: error: --trace -: not JSON")


def test_bare_starvecheck_prints_the_help_as_help() -> None:
    r = run()
    assert r.exit_code == 2
    assert r.stderr.startswith("Usage: starvecheck") and "error:" not in r.stderr
    assert "\n  doctor " in r.stderr  # the command list, one per line


def test_control_characters_from_the_user_are_escaped(tmp_path: Path) -> None:
    path = str(tmp_path / "x\x1b[31mred\nline")
    err = one_line(run("io", path))
    assert "\x1b" not in err and "\\x1b[31mred\\nline" in err


def test_sighup_exits_129() -> None:
    from starvecheck.core.status import ExitStatus, signal_status

    assert signal_status(1) == ExitStatus.HANGUP == 129


def test_running_out_of_file_descriptors_anyway_is_one_line(monkeypatch, tmp_path: Path) -> None:
    import errno

    from starvecheck.cli import args

    def emfile(*a, **k):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(args, "data_path", emfile)
    err = one_line(run("io", str(tmp_path)))
    assert "too many open files" in err and "ulimit -n" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("unbuffered", ["1", None])
def test_a_full_stdout_is_one_line(unbuffered: str | None) -> None:
    # Buffered (no PYTHONUNBUFFERED, as a login shell has it): what is left in the buffer
    # must not fail a second time when Python flushes at exit (it did: exit 120).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    with open("/dev/full", "w") as full:
        r = subprocess.run([*SC, "env"], stdout=full, stderr=subprocess.PIPE, text=True, env=env)
    assert r.returncode == 2
    assert r.stderr == (
        "starvecheck: error: cannot write to standard output: No space left on device\n"
    )


def test_an_existing_writable_file_in_a_closed_directory_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /dev/null for an ordinary user: the file is writable, its directory is not.
    from starvecheck.cli.common import FailOn, Outputs

    target = tmp_path / "report.json"
    target.write_text("")
    deny_access(monkeypatch, lambda p: p == str(tmp_path))
    assert Outputs.check(str(target), None, FailOn.never).json == str(target)
    with pytest.raises(Exception, match="not writable"):
        Outputs.check(str(tmp_path / "new.json"), None, FailOn.never)
