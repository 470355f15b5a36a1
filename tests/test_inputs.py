"""Every reader bounded and non-blocking (issue 30): traces, workload files, datasets
(named or in a workload), --lengths. A FIFO, a device, a socket or a directory where a
file is meant is one line and exit 2 before anything opens it; what is read is counted
as it is read, gzip unpacked included; a pipe or terminal that stays silent ends in one
line. Each case that could hang runs in a subprocess under a timeout."""

from __future__ import annotations

import gzip
import io
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starvecheck.cli import main
from starvecheck.core.context import Context
from starvecheck.core.status import UsageError
from starvecheck.inputs import dataset, streams
from starvecheck.inputs import files as inputs
from starvecheck.inputs import lengths as lengthsfile
from tests.conftest import FIXTURES, PEAK, one_line, run, tiny_tokenizer

TRACE = FIXTURES / "traces" / "gpu.json.gz"
SC = [sys.executable, "-m", "starvecheck"]


def sub_one_line(argv: list[str], **kw) -> str:
    """A subprocess run, at most 60 s: exit 2 and one line on stderr."""
    try:
        r = subprocess.run([*SC, *argv], capture_output=True, text=True, timeout=60, **kw)
    except subprocess.TimeoutExpired:
        pytest.fail(f"starvecheck {' '.join(argv)} hung")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


# --- a gzip bomb ------------------------------------------------------------------


def test_a_gzip_bomb_trace_stops_at_the_limit_and_memory_stays_bounded(tmp_path: Path) -> None:
    # 200 MiB of whitespace in a ~200 KB gzip: read whole, it cost 6.3 GB from 14 MB.
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (200 << 20)))
    argv = [*SC, "profile", "--trace", str(bomb), "--max-trace-bytes", "1M"]
    r = subprocess.run(
        [sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, timeout=120
    )
    *lines, peak = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert lines == [
        f"starvecheck: error: --trace {bomb}: more than 1 MiB unpacked (the limit; raise it "
        "with --max-trace-bytes, 0 for none)"
    ]
    assert int(peak) < 150 << 10  # KiB: well under the 200 MiB it unpacks to


def test_the_trace_limit_refuses_a_plain_file_before_reading_and_0_lifts_it(
    tmp_path: Path,
) -> None:
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress(TRACE.read_bytes()))
    err = one_line(run("profile", "--trace", str(plain), "--max-trace-bytes", "1K"))
    assert "KiB, over 1 KiB (the limit; raise it with --max-trace-bytes" in err
    assert run("profile", "--trace", str(plain), "--max-trace-bytes", "0").exit_code == 0
    err = one_line(run("profile", "--trace", str(plain), "--max-trace-bytes", "lots"))
    assert "--max-trace-bytes 'lots': expected a size" in err
    assert "applies with --trace" in one_line(run("profile", "--max-trace-bytes", "1G"))


def test_a_trace_over_the_limit_in_a_folder_is_not_skipped_as_not_a_trace(tmp_path: Path) -> None:
    (tmp_path / "rank0.json.gz").write_bytes(TRACE.read_bytes())
    (tmp_path / "rank1.json.gz").write_bytes(gzip.compress(b" " * (4 << 20)))
    err = one_line(run("profile", "--trace", str(tmp_path), "--max-trace-bytes", "2M"))
    assert "rank1.json.gz: more than 2 MiB unpacked" in err


def test_the_trace_limit_default_is_the_loaders() -> None:
    from starvecheck.stages.options import TraceOptions
    from starvecheck.stages.trace.load import MAX_BYTES

    assert TraceOptions.max_bytes == MAX_BYTES == 4 << 30
    assert "[default: 4G; 0: no limit]" in " ".join(run("profile", "--help").stdout.split())


# --- not a file -------------------------------------------------------------------


@pytest.fixture
def not_files(tmp_path: Path) -> Iterator[dict[str, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        yield {
            "fifo": str(fifo),
            "/dev/zero": "/dev/zero",
            "/dev/urandom": "/dev/urandom",
            "socket": str(tmp_path / "sock"),
            "directory": str(tmp_path),
        }
    finally:
        sock.close()


WHAT = {
    "fifo": "a FIFO (named pipe), not a regular file",
    "/dev/zero": "a character device, not a regular file",
    "/dev/urandom": "a character device, not a regular file",
    "socket": "a socket, not a regular file",
    "directory": "is a directory",
}


def _argv(where: str, path: str, tmp_path: Path) -> list[str]:
    if where == "workload dataset":
        toml = tmp_path / "w.toml"
        toml.write_text(f"dataset = {path!r}\n".replace("'", '"'))
        return ["doctor", "--quick", "--only", "pad", "--workload", str(toml)]
    return {
        "--trace": ["profile", "--trace", path],
        "--workload": ["doctor", "--quick", "--only", "pad", "--workload", path],
        "--lengths": ["pad", "--lengths", path],
        "--dataset": ["pad", "--dataset", path],
    }[where]


@pytest.mark.parametrize("kind", list(WHAT))
@pytest.mark.parametrize(
    "where", ["--trace", "--workload", "--lengths", "--dataset", "workload dataset"]
)
def test_what_is_not_a_file_is_one_line_and_no_hang(
    where: str, kind: str, not_files: dict[str, str], tmp_path: Path
) -> None:
    path, what = not_files[kind], WHAT[kind]
    if kind == "directory" and where == "--trace":  # a folder of traces, without any
        what = "a directory with no trace files"
    err = sub_one_line(_argv(where, path, tmp_path))
    shown = "--workload " if where == "workload dataset" else f"{where} "
    assert shown in err and what in err, err


def test_a_kernel_interface_file_is_no_input() -> None:
    err = one_line(run("pad", "--lengths", "/proc/version"))
    assert err.endswith("--lengths /proc/version: a file of a kernel interface, not input\n")


# --- pipes and standard input ------------------------------------------------------

SILENT = (
    "import sys; from starvecheck.inputs import files; files.IDLE_TIMEOUT_S = 0.5; "
    "from starvecheck.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize("argv", [["profile", "--trace", "-"], ["pad", "--lengths", "-"]])
@pytest.mark.parametrize("source", ["pipe", "terminal"])
def test_a_silent_pipe_or_terminal_on_stdin_ends_in_one_line(argv: list[str], source: str):
    if source == "terminal":
        writer, reader = os.openpty()
    else:
        reader, writer = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", SILENT, *argv],
            stdin=reader,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"{argv} hung on a silent {source}")
    finally:
        os.close(reader)
        os.close(writer)
    assert proc.returncode == 2, err
    assert err == (
        f"starvecheck: error: {argv[1]} -: nothing came for 0.5 s (a terminal, or a pipe "
        "whose writer never ends it): give a file, or end the input\n"
    )


def test_a_device_on_stdin_is_refused_and_dev_null_is_empty() -> None:
    with open("/dev/zero", "rb") as zero:
        err = sub_one_line(["pad", "--lengths", "-"], stdin=zero)
    assert "--lengths -: standard input is a character device" in err
    with open(os.devnull, "rb") as null:
        err = sub_one_line(["pad", "--lengths", "-"], stdin=null)
    assert "--lengths -: no lengths" in err


def _in_process(argv: list[str], stdin: io.TextIOWrapper) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    c = Context(stdout=out, stderr=err, stdin=stdin, environ={}, stdout_isatty=False)
    return int(main(argv, c)), err.getvalue()


def test_a_pipe_the_shell_hands_over_is_read_and_a_silent_one_ends(monkeypatch) -> None:
    # `--lengths <(cut ...)` is /dev/fd/63: a pipe, meant; a writer that never ends it
    # is one line after the idle time.
    monkeypatch.setattr(inputs, "IDLE_TIMEOUT_S", 0.3)
    reader, writer = os.pipe()
    os.write(writer, b"5\n7\n")
    os.close(writer)
    r = run("pad", "--lengths", f"/dev/fd/{reader}", "--json", "-")
    os.close(reader)
    assert r.exit_code == 0 and r.json["stages"][0]["parameters"]["source"] == "lengths"
    reader, writer = os.pipe()
    try:
        err = one_line(run("pad", "--lengths", f"/dev/fd/{reader}"))
    finally:
        os.close(reader)
        os.close(writer)
    assert "nothing came for 0.3 s" in err
    reader, writer = os.pipe()
    os.write(writer, b"3\n4\n")
    os.close(writer)
    with os.fdopen(reader, "r") as stdin:  # standard input a real pipe, in-process
        code, err = _in_process(["pad", "--lengths", "-", "--json", "-"], stdin)
    assert code == 0, err


# --- limits on what is held -----------------------------------------------------------


def test_a_workload_file_over_1_mib_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "w.toml"
    big.write_text("# padding\n" * (110 << 10) + "batch_size = 4\n")
    err = one_line(run("doctor", "--quick", "--only", "pad", "--workload", str(big)))
    assert f"--workload {big}: " in err and "over 1 MiB (the limit)" in err


def test_lengths_and_datasets_are_bounded_unless_limit_says_how_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lengthsfile, "MAX_LENGTHS", 10)
    lengths = tmp_path / "l.txt"
    lengths.write_text("5\n" * 11)
    err = one_line(run("pad", "--lengths", str(lengths)))
    assert "more than 10 lengths" in err and "--limit N" in err
    assert run("pad", "--lengths", str(lengths), "--limit", "11").exit_code == 0
    monkeypatch.setattr(dataset, "MAX_HELD", 1000)
    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2, 3]}\n' * 20)  # 20 samples of 64 each
    err = one_line(run("pad", "--dataset", str(data)))
    assert "characters of samples" in err and "--limit N" in err
    assert run("pad", "--dataset", str(data), "--limit", "20").exit_code == 0


def test_a_gzip_bomb_of_blank_lengths_stops_at_the_byte_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lengthsfile, "MAX_LENGTHS_BYTES", 1 << 20)
    bomb = tmp_path / "l.txt.gz"
    bomb.write_bytes(gzip.compress(b"\n" * (8 << 20)))
    err = one_line(run("pad", "--lengths", str(bomb)))
    assert "more than 1 MiB unpacked (the limit; measure the first N samples with" in err


def test_a_line_with_no_end_is_refused_after_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `cat /dev/zero |` as --lengths - or a text dataset: NULs with no "\n", for ever.
    monkeypatch.setattr(streams, "MAX_LINE_CHARS", 100_000)
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"\0" * 1_000_000)
    tok = str(tiny_tokenizer(tmp_path / "tok"))
    for argv in (["--lengths", str(nul)], ["--dataset", str(nul), "--tokenizer", tok]):
        err = one_line(run("pad", *argv))
        assert "line 1 goes on past 100,000 characters with no line end" in err


# --- the reader itself ------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=3000),
    limit=st.one_of(st.none(), st.integers(0, 3000)),
    zipped=st.booleans(),
    chunk=st.sampled_from([1, 7, 1 << 20]),
)
def test_what_is_read_is_the_file_or_one_line_past_the_limit(data, limit, zipped, chunk):
    import tempfile

    with tempfile.TemporaryDirectory() as top:
        path = os.path.join(top, "f")
        Path(path).write_bytes(gzip.compress(data) if zipped else data)
        old = inputs.CHUNK
        inputs.CHUNK = chunk
        try:
            with inputs.open_input(path, "--x f", limit, gunzip=zipped) as f:
                got = inputs.read_all(f)
        except inputs.TooLarge as e:
            assert limit is not None and len(data) > limit
            assert str(e).startswith("--x f: ")
            return
        finally:
            inputs.CHUNK = old
    assert bytes(got) == data and (limit is None or len(data) <= limit)


@given(text=st.text(max_size=30))
def test_byte_limits_are_a_size_or_one_line(text: str) -> None:
    from starvecheck.cli import args
    from starvecheck.core.units import parse_size

    try:
        got = args.byte_limit("--max-trace-bytes", text)
    except UsageError as e:
        assert parse_size(text) is None and str(e).startswith("--max-trace-bytes ")
        return
    assert got == (parse_size(text) or None)
