"""`pad` on hostile files: memory bounded by the context, not by the record; every bad
file one line and exit 2."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from starvecheck.inputs import records
from tests.conftest import PEAK, one_line, run, tiny_tokenizer

WORDS = "the quick brown fox jumps over the lazy dog "


@pytest.mark.slow
def test_a_huge_single_line_is_cut_while_read_and_memory_stays_bounded(tmp_path: Path) -> None:
    # 48 MiB in one line: before 0.2 about 5 GB resident (a 100 MB line: 11 GB, 88 s).
    tok = tiny_tokenizer(tmp_path / "tok")
    path = tmp_path / "one-line.txt"
    block = (WORDS * 4096).encode()
    with open(path, "wb") as f:
        for _ in range((48 << 20) // len(block)):
            f.write(block)
        f.write(b"\nthe lazy dog\n")
    argv = [sys.executable, "-m", "starvecheck", "pad", "--dataset", str(path)]
    argv += ["--tokenizer", str(tok), "--context", "512", "--json", "-"]
    r = subprocess.run(
        [sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    peak_mib = int(r.stderr.strip().splitlines()[-1]) / 1024
    assert peak_mib < 1024, peak_mib  # the imports alone are about 300 MiB
    stage = json.loads(r.stdout)["stages"][0]
    assert any("1 sample over 32,768 characters" in c for c in stage["caveats"])
    truncated = next(m for m in stage["metrics"] if m["name"] == "truncated_samples")
    assert truncated["value"] == 1  # the long line still fills the context


def test_a_record_too_long_to_parse_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(records, "RECORD_CHARS", 1000)
    long_text = WORDS * 100
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": long_text}) + "\n")
    err = one_line(run("pad", "--dataset", str(jsonl), "--tokenizer", "unused"))
    assert "line 2 is over" in err and "--lengths" in err
    array = tmp_path / "d.json"
    array.write_text(json.dumps([{"text": long_text}]))
    assert "write it as JSON Lines" in one_line(run("pad", "--dataset", str(array)))
    csv = tmp_path / "d.csv"
    csv.write_text("text\n" + long_text + "\n")
    assert "line 2 is over" in one_line(run("pad", "--dataset", str(csv)))


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_a_byte_order_mark_is_not_part_of_the_first_field(tmp_path: Path, suffix: str) -> None:
    tok = tiny_tokenizer(tmp_path / "tok")
    path = tmp_path / f"bom.{suffix}"
    body = "text\nthe lazy dog\n" if suffix == "csv" else '{"text": "the lazy dog"}\n'
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    r = run("pad", "--dataset", str(path), "--tokenizer", str(tok), "--json", "-")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize(
    "value, kind", [("5", "a number"), ("true", "a boolean"), ("1e400", "a number")]
)
def test_a_text_field_that_is_not_text_is_refused(tmp_path: Path, value: str, kind: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "the dog"}\n{"text": ' + value + "}\n")
    err = one_line(run("pad", "--dataset", str(path), "--tokenizer", "unused"))
    assert f"line 2: field 'text' holds {kind}" in err


def _parquet(path: Path) -> bytes:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pq.write_table(pa.table({"text": ["the lazy dog"] * 100}), str(path))
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["truncated", "fake", "corrupt", "gzipped"])
def test_a_bad_parquet_file_is_one_line(tmp_path: Path, damage: str) -> None:
    good = _parquet(tmp_path / "good.parquet")
    path = tmp_path / "bad.parquet"
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "fake":
        path.write_bytes(b"PAR1 this is not parquet at all PAR1")
    elif damage == "corrupt":
        middle = len(good) // 2
        path.write_bytes(good[:middle] + bytes(64) + good[middle + 64 :])
    else:
        path = tmp_path / "bad.parquet.gz"
        path.write_bytes(gzip.compress(good))
    r = run("pad", "--dataset", str(path), "--tokenizer", str(tiny_tokenizer(tmp_path / "t")))
    err = one_line(r)
    assert str(path) in err


def test_a_tokenizer_error_says_its_cause(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{ not json")
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "the dog"}\n')
    err = one_line(run("pad", "--dataset", str(path), "--tokenizer", str(tmp_path / "tok")))
    # The class and what it said, not a bare class name at the end of the line.
    assert not err.rstrip().endswith(("Error", "Exception"))


@pytest.mark.slow
def test_a_huge_line_of_lengths_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("12\n" + "9" * (160 << 20) + "\n")
    argv = [sys.executable, "-m", "starvecheck", "pad", "--lengths", str(path)]
    r = subprocess.run([sys.executable, "-c", PEAK, *argv], capture_output=True, text=True)
    *lines, peak_kib = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "line 2" in lines[0]
    assert int(peak_kib) < 150 << 10  # 160 MiB of digits, never held whole


def test_a_lone_tokenizer_json_is_a_tokenizer(tmp_path: Path) -> None:
    tok = tiny_tokenizer(tmp_path / "tok") / "tokenizer.json"
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "the lazy dog"}\n{"text": "the quick brown fox"}\n')
    r = run("pad", "--dataset", str(path), "--tokenizer", str(tok), "--json", "-")
    assert r.exit_code == 0, r.stderr
    assert r.json["stages"][0]["parameters"]["tokenizer"] == str(tok)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    err = one_line(run("pad", "--dataset", str(path), "--tokenizer", str(bad)))
    assert "not a tokenizer.json" in err
