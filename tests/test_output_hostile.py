"""What the report meets on its way out: a locale that cannot encode it, a PATH whose
name is not UTF-8 or holds control characters, a directory `clean` cannot list, a
filesystem too small for any test data. Each ends in a readable report or one line
with exit 2, never a traceback after the measurement, never a terminal recoloured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

import pytest

from starvecheck.core.text import escaped, printable
from starvecheck.scratch import directory as scratch
from starvecheck.scratch import leftovers
from starvecheck.stages.samples import mds
from tests.conftest import run, sysroot_env
from tests.test_hostile import NOBODY, nobody_cannot_run_starvecheck

SC = [sys.executable, "-m", "starvecheck"]
# C0 and C1 controls a terminal acts on: escape sequences (ESC, CSI as one byte),
# a bell, a backspace, a carriage return, NEL.
HOSTILE = "d\x1b]0;owned\x07\x1b[31mred\x9b2J\x08\r\x85x"


def _env(**changes: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for key, value in changes.items():
        env.pop(key, None)
        if value is not None:
            env[key] = value
    return env


def _controls(text: str) -> list[str]:
    """Control characters in `text` other than the newline that ends each line."""
    return [ch for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf")]


# --- 7: a locale that cannot encode the report ----------------------------------------

LOCALES = {
    "C": {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": None},
    "latin-1": {"PYTHONIOENCODING": "latin-1", "PYTHONUTF8": "0"},
}


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_env_prints_in_a_locale_that_cannot_encode_its_characters(locale: str) -> None:
    env = _env(**LOCALES[locale], **sysroot_env("baremetal-numa-8gpu"))
    r = subprocess.run([*SC, "env"], capture_output=True, env=env, check=False, timeout=60)
    assert r.returncode == 0, r.stderr.decode("latin-1")
    assert b"Traceback" not in r.stderr
    out = r.stdout.decode("latin-1")
    assert out.startswith("starvecheck env")
    assert "\\u" not in out.splitlines()[0]  # the title's "·" as ASCII, not an escape


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_io_report_and_markdown_print_in_a_locale_that_cannot_encode_them(
    locale: str, tmp_path: Path
) -> None:
    env = _env(**LOCALES[locale])
    io = [*SC, "io", "--samples", "64", "--sample-size", "4K", "--runs", "2", "--threads", "1"]
    for extra in ([], ["--markdown", "-"]):
        argv = [*io, "--no-cold", *extra, str(tmp_path)]
        r = subprocess.run(argv, capture_output=True, env=env, check=False, timeout=120)
        assert r.returncode == 0, r.stderr.decode("latin-1")
        out = r.stdout.decode("ascii" if locale == "C" else "latin-1")
        assert ("min ... max" in out) if not extra else ("### Checklist" in out)
    assert list(tmp_path.iterdir()) == []


def test_json_is_unchanged_in_a_c_locale(tmp_path: Path) -> None:
    env = _env(**LOCALES["C"], **sysroot_env("baremetal-numa-8gpu"))
    r = subprocess.run(
        [*SC, "env", "--json", "-"], capture_output=True, env=env, check=False, timeout=60
    )
    assert r.returncode == 0 and json.loads(r.stdout)["command"] == "env"
    r.stdout.decode("ascii")  # ensure_ascii, as before


# --- 8: a PATH whose name is not UTF-8 ------------------------------------------------


def test_streaming_is_ruled_out_before_measuring_where_the_name_is_not_utf8() -> None:
    odd = os.fsdecode(b"/tmp/data-\xff")
    assert "not UTF-8" in (mds.unusable_under(odd) or "")
    assert mds.unusable_under("/tmp/data-\u00e9\x1b") is None  # UTF-8, however odd
    streaming, why = mds.streaming_or_why(odd)
    assert streaming is None and "not UTF-8" in why


def _odd_dir(tmp_path: Path) -> bytes:
    odd = os.fsencode(str(tmp_path)) + b"/data-\xff"
    os.mkdir(odd)
    return odd


@pytest.mark.slow
def test_loader_keeps_the_other_layouts_where_streaming_cannot_read(tmp_path: Path) -> None:
    pytest.importorskip("streaming")
    odd = _odd_dir(tmp_path)
    argv = [*SC, "loader", "--quick", "--samples", "64", "--sample-size", "4K", "--workers",
            "0", "--runs", "1", "--no-cold", "--json", "-", odd]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, env=_env(), check=False, timeout=180)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    metrics = {m["name"]: m for m in json.loads(r.stdout)["stages"][0]["metrics"]}
    assert metrics["throughput.mds"]["value"] is None
    assert "not UTF-8" in metrics["throughput.mds"]["reason"]
    measured = [
        m for m in metrics.values() if m["labels"].get("layout") in ("small_files", "shard")
    ]
    assert measured and all(m["value"] is not None for m in measured)
    assert os.listdir(odd) == []


@pytest.mark.slow
def test_profile_keeps_the_other_layouts_where_streaming_cannot_read(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("streaming")
    odd = _odd_dir(tmp_path)
    argv = [*SC, "profile", "--quick", "--workers", "0", "--steps", "2", "--json", "-", odd]
    r = subprocess.run(argv, capture_output=True, env=_env(), check=False, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    stage = json.loads(r.stdout)["stages"][0]
    layouts = {m["labels"].get("layout") for m in stage["metrics"]}
    assert "small_files" in layouts and "mds" not in layouts
    assert any("mds layout was not measured" in c for c in stage["caveats"])
    assert os.listdir(odd) == []


# --- 12: a directory `clean` cannot list ----------------------------------------------


def test_clean_says_when_it_cannot_list_the_directory(monkeypatch, tmp_path: Path) -> None:
    def refused(path: object) -> list[str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "listdir", refused)  # as for a user without read permission
    r = run("clean", str(tmp_path))
    assert r.exit_code == 2 and r.stdout == ""
    assert (
        r.stderr
        == f"starvecheck: error: {tmp_path}: cannot list the directory: Permission denied\n"
    )


def test_clean_as_another_user_on_a_directory_it_cannot_read() -> None:
    why = nobody_cannot_run_starvecheck()
    if why:
        pytest.skip(why)
    top = Path(tempfile.mkdtemp(prefix="starvecheck-test-"))
    try:
        top.chmod(0o755)
        closed = top / "closed"
        closed.mkdir()
        closed.chmod(0o311)  # searchable, not readable
        r = subprocess.run([*NOBODY, *SC, "clean", str(closed)], capture_output=True, text=True,
                           env=_env(), check=False)  # fmt: skip
        assert r.returncode == 2 and r.stdout == ""
        assert "cannot list the directory" in r.stderr and r.stderr.count("\n") == 1
    finally:
        shutil.rmtree(top)


def test_leftovers_of_a_run_are_none_where_the_directory_cannot_be_listed(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "listdir", lambda p: (_ for _ in ()).throw(PermissionError(13, "no")))
    assert leftovers.dead(str(tmp_path)) == []
    with pytest.raises(PermissionError):
        leftovers.scan(str(tmp_path))


# --- 13: control characters from outside, in every renderer ---------------------------


def test_printable_escapes_c0_c1_and_bytes_that_are_not_utf8() -> None:
    assert printable("a\x1b[31mb\x9b\x85\x07") == "a\\x1b[31mb\\x9b\\x85\\x07"
    assert printable(os.fsdecode(b"x\xff")) == "x\\xff"
    assert printable("café · 中文 …") == "café · 中文 …"


def test_escaped_reaches_every_string_of_a_report_and_keeps_caveat_ids() -> None:
    from starvecheck.core.metric import Caveat, Metric
    from starvecheck.core.model import Finding, Severity, StageResult
    from starvecheck.core.report import Report

    stage = StageResult(
        "io",
        {"path": "/p\x1b"},
        (Metric("m", 1.0, "x", labels={"layout": "l\x1b"}),),
        (Finding("x.y", Severity.INFO, "t\x1b", "e\x1b"),),
        (Caveat("a.b", "c\x1b"),),
    )
    report = escaped(Report("io", {"storage": {"mount": "/m\x1b"}}, (stage,), verdict="v\x1b"))
    assert "\x1b" not in repr(report)
    s = report.stages[0]
    assert s.caveats[0].id == "a.b" and s.caveats[0] == "c\\x1b"
    assert s.findings[0].severity is Severity.INFO and s.parameters["path"] == "/p\\x1b"


@pytest.mark.parametrize("command", ["io", "loader"])
@pytest.mark.parametrize("output", [(), ("--markdown", "-")])
def test_control_characters_in_path_never_reach_stdout(command, output, own_tmpdir) -> None:
    path = own_tmpdir / HOSTILE  # a short path: the report shows it on one line
    path.mkdir()
    small = ["--samples", "64", "--sample-size", "4K"]
    options = {
        "io": [*small, "--runs", "2", "--threads", "1"],
        "loader": ["--quick", *small, "--workers", "0", "--runs", "1"],
    }[command]
    r = run(command, *options, "--no-cold", *output, str(path))
    assert r.exit_code == 0, r.stderr
    assert _controls(r.stdout) == [], sorted(set(_controls(r.stdout)))
    assert "\\x1b]0;owned\\x07" in r.stdout  # shown, escaped
    assert list(path.iterdir()) == []


# --- a filesystem too small for any test data -----------------------------------------


def _statvfs(free: int) -> os.statvfs_result:
    return os.statvfs_result((4096, 1, free, free, free, 1 << 20, 1 << 20, 1 << 20, 0, 255))


def test_a_tiny_filesystem_is_told_what_helps_not_fewer_samples(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(os, "statvfs", lambda p: _statvfs(20 << 20))  # 20 MiB free
    io = scratch.space_problem(str(tmp_path), 10, 4096, elsewhere=scratch.OR_EXISTING)
    assert io is not None and "--samples" not in io and "--sample-size" not in io
    assert "more free space" in io and "--existing" in io
    doctor = scratch.space_problem(str(tmp_path), 10, 4096, **scratch.doctor_remedies(False))
    assert doctor is not None and "--samples" not in doctor and "--existing" not in doctor
    assert "--skip io,loader" in doctor
    # Room beyond the margin, too little for this much data: less data is the remedy.
    monkeypatch.setattr(os, "statvfs", lambda p: _statvfs(scratch.MARGIN_BYTES + (1 << 20)))
    doctor = scratch.space_problem(str(tmp_path), 10_000, 65536, **scratch.doctor_remedies(False))
    assert doctor is not None and "--sample-size or --quick" in doctor
    assert "--samples" not in doctor


def test_io_on_a_tiny_filesystem_is_one_line_naming_what_helps(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(os, "statvfs", lambda p: _statvfs(20 << 20))
    r = run("io", "--quick", str(tmp_path))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "--existing" in r.stderr and "fewer --samples" not in r.stderr


def test_clean_tells_a_missing_path_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    r = run("clean", str(tmp_path / "missing"))
    assert r.exit_code == 2 and r.stderr.endswith("missing: no such directory\n")
    r = run("clean", str(tmp_path / "file"))
    assert r.exit_code == 2 and r.stderr.endswith("file: not a directory\n")
