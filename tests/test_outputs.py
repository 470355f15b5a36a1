"""Output errors (issue 30): --plot, --json and --markdown to a full device, a
read-only path, a file of a kernel interface or a directory are exit 2 and one line
(never 70); two outputs naming one file, or an output naming an input, are refused
before anything is measured."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, deny_access, one_line, run

TRACE = FIXTURES / "traces" / "gpu.json.gz"
needs_plot = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib"
)


def refused_before_measuring(*argv: str) -> str:
    """One line, and nothing measured: pad's default lengths take well under a second
    but print a table; a refusal prints nothing."""
    r = run("pad", "--quick", *argv)
    err = one_line(r)
    assert r.stdout == ""
    return err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize(
    "option", [pytest.param("--plot", marks=needs_plot), "--json", "--markdown"]
)
def test_a_full_device_is_one_line(option: str) -> None:
    err = one_line(run("pad", "--quick", option, "/dev/full"))
    assert (
        err == f"starvecheck: error: {option} /dev/full: cannot write it: No space left on device\n"
    )


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="needs /proc")
@pytest.mark.parametrize(
    "option", [pytest.param("--plot", marks=needs_plot), "--json", "--markdown"]
)
def test_a_kernel_interface_file_is_refused_before_measuring(option: str) -> None:
    err = refused_before_measuring(option, "/proc/version")
    assert f"{option} /proc/version: a file of a kernel interface (proc), not one to write" in err


@pytest.mark.parametrize(
    "option", [pytest.param("--plot", marks=needs_plot), "--json", "--markdown"]
)
def test_a_directory_is_refused_before_measuring(option: str, tmp_path: Path) -> None:
    err = refused_before_measuring(option, str(tmp_path))
    assert "is a directory" in err or "needs a file path" in err


@pytest.mark.parametrize(
    "option", [pytest.param("--plot", marks=needs_plot), "--json", "--markdown"]
)
def test_a_read_only_path_is_refused_before_measuring(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = tmp_path / "ro"
    closed.mkdir()
    (closed / "old.out").write_text("")
    if os.geteuid() == 0:  # root writes anywhere: the kernel's answer, as access(2) gives it
        deny_access(monkeypatch, lambda p: p.startswith(str(closed)))
    else:
        (closed / "old.out").chmod(0o444)
        closed.chmod(0o555)
    try:
        for target in (closed / "new.out", closed / "old.out"):
            err = refused_before_measuring(option, str(target))
            assert err.endswith(f"{option} {target}: not writable\n"), err
    finally:
        closed.chmod(0o755)


@needs_plot
def test_a_plot_that_cannot_be_written_late_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writable when checked, gone read-only by the time the picture is drawn: the
    # writer's temporary file (core/outputs.py) cannot be made.
    target = tmp_path / "p.png"
    real = os.open

    def read_only(path, *a, **k):
        if str(path).startswith(".p.png.starvecheck-"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", read_only)
    err = one_line(run("pad", "--quick", "--plot", str(target)))
    assert err.endswith(f"--plot {target}: cannot write it: Permission denied\n")


@pytest.mark.parametrize(
    "first, second",
    [
        pytest.param("--plot", "--json", marks=needs_plot),
        pytest.param("--plot", "--markdown", marks=needs_plot),
        ("--json", "--markdown"),
    ],
)
def test_two_outputs_naming_one_file_are_refused_before_measuring(
    first: str, second: str, tmp_path: Path
) -> None:
    target = tmp_path / "out"
    (tmp_path / "link").symlink_to(target)
    for other in (str(target), str(tmp_path / "." / "out"), str(tmp_path / "link")):
        err = refused_before_measuring(first, str(target), second, other)
        assert "are the same file: give each its own" in err
    assert not target.exists()


@needs_plot
def test_plot_and_json_to_one_file_are_refused_by_every_command_with_a_plot(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "x.png")
    for command in (
        ["starve", "--quick"],
        ["loader", "--quick", str(tmp_path)],
        ["doctor", "--quick"],
    ):
        err = one_line(run(*command, "--plot", target, "--json", target))
        assert "--json" in err and "are the same file" in err


def test_stdout_is_one_output_and_a_plot_is_no_stdout() -> None:
    err = refused_before_measuring("--json", "-", "--markdown", "-")
    assert "cannot both write to stdout" in err
    if importlib.util.find_spec("matplotlib") is not None:
        assert "--plot '-': needs a file path" in refused_before_measuring("--plot", "-")


def test_an_output_naming_an_input_is_refused_before_reading(tmp_path: Path) -> None:
    lengths = tmp_path / "l.txt"
    lengths.write_text("5\n7\n")
    err = refused_before_measuring("--lengths", str(lengths), "--markdown", str(lengths))
    assert "is the file --lengths" in err and "would overwrite it" in err
    assert lengths.read_text() == "5\n7\n"
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(TRACE.read_bytes())
    err = one_line(run("profile", "--trace", str(trace), "--json", str(trace)))
    assert "is the file --trace" in err and trace.read_bytes() == TRACE.read_bytes()
    workload = tmp_path / "w.toml"
    workload.write_text(f'dataset = "{lengths}"\n')
    for output in (str(workload), str(lengths)):
        err = one_line(run("doctor", "--quick", "--workload", str(workload), "--json", output))
        assert "would overwrite it" in err
    factory = tmp_path / "f.py"
    factory.write_text("def make():\n    return []\n")
    err = one_line(run("loader", "--factory", f"{factory}:make", "--json", str(factory)))
    assert "is the file --factory" in err
