"""A dataset file's records, from the six formats `pad --dataset` reads (JSON Lines,
JSON, Parquet, CSV, TSV, plain text; gzipped or not), over the bounded text streams
of streams.py. A record is parsed whole only up to RECORD_CHARS: a longer one is
refused in one line, since it cannot be parsed in part.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Sequence
from typing import IO, Any

from starvecheck.core.signals import importing
from starvecheck.core.status import UsageError
from starvecheck.inputs.files import check
from starvecheck.inputs.streams import Cut, bounded_lines, open_text

_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "text",
}
# Memory is bounded by these, not by the largest record of the user's file.
# A record (a JSON Lines line, a CSV row's line, a JSON array file) longer than this
# is refused: it cannot be parsed in part.
RECORD_CHARS = 64 << 20


def detect_format(path: str) -> str:
    name = path.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return _SUFFIXES.get(os.path.splitext(name)[1], "text")


def _jsonl(path: str, f: IO[str]) -> Iterator[tuple[str, Any]]:
    for lineno, line, _ in bounded_lines(f, RECORD_CHARS, f"--dataset {path}"):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(
                f"--dataset {path}: line {lineno}: not JSON ({e.msg}); JSON Lines has one "
                "object per line"
            ) from None
        except RecursionError:
            raise UsageError(f"--dataset {path}: line {lineno}: JSON nested too deeply") from None
        yield f"line {lineno}", value


def _json(path: str, f: IO[str]) -> Iterator[tuple[str, Any]]:
    head = f.read(1)
    while head and head.isspace():
        head = f.read(1)
    if head != "[":  # a .json file that is JSON Lines after all
        yield from _jsonl(path, _Prefixed(head, f))
        return
    text = head + f.read(RECORD_CHARS)
    if len(text) > RECORD_CHARS:
        raise UsageError(
            f"--dataset {path}: a JSON array over {RECORD_CHARS >> 20} Mi characters: it is "
            "parsed whole, so starvecheck refuses it to keep memory bounded; write it as JSON "
            "Lines (one object per line), which is read a record at a time"
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--dataset {path}: not JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise UsageError(f"--dataset {path}: JSON nested too deeply") from None
    for i, value in enumerate(data):
        yield f"record {i + 1}", value


class _Prefixed:
    """A text file with what was already read from it put back in front."""

    def __init__(self, head: str, f: IO[str]) -> None:
        self.head, self.f = head, f

    def readline(self, size: int = -1) -> str:
        if not self.head:
            return self.f.readline(size)
        line = self.head + self.f.readline(size - len(self.head) if size > 0 else -1)
        self.head = ""
        return line


def _delimited(path: str, f: IO[str], delimiter: str) -> Iterator[tuple[str, Any]]:
    csv.field_size_limit(RECORD_CHARS)  # one long document per cell is normal here
    lines = (line for _, line, _ in bounded_lines(f, RECORD_CHARS, f"--dataset {path}"))
    reader = csv.DictReader(lines, delimiter=delimiter)
    try:
        for row in reader:
            yield f"line {reader.line_num}", row
    except csv.Error as e:
        raise UsageError(f"--dataset {path}: line {reader.line_num}: {e}") from None


def _text(path: str, f: IO[str], max_chars: int) -> Iterator[tuple[str, Any]]:
    for lineno, line, cut in bounded_lines(f, max_chars, name=f"--dataset {path}"):
        text = line.rstrip("\r\n")
        if text.strip():
            yield f"line {lineno}", Cut(text) if cut else text


def _parquet(
    path: str, columns: Sequence[str] | None, schema_only: bool = False
) -> Iterator[tuple[str, Any]]:
    check(path, f"--dataset {path}", pipes=False)  # Parquet is read by seeking
    if path.lower().endswith(".gz"):
        raise UsageError(
            f"--dataset {path}: a gzipped Parquet file; Parquet compresses its own pages, so "
            "it is read as written: gunzip it first"
        )
    try:
        with importing("pyarrow"):
            import pyarrow.parquet as pq  # an optional extra: starvecheck[parquet]
    except ImportError:
        raise UsageError(
            f"--dataset {path}: Parquet needs pyarrow: pip install 'starvecheck[parquet]'"
        ) from None
    try:
        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
        if schema_only:
            yield "schema", names
            return
        wanted = [c for c in columns if c in names] if columns else None
        if columns and not wanted:
            yield "record 1", dict.fromkeys(names)  # let the field check name the columns
            return
        n = 0
        for batch in table.iter_batches(batch_size=4096, columns=wanted):
            for row in batch.to_pylist():
                n += 1
                yield f"record {n}", row
    except (OSError, ValueError) as e:  # ArrowIOError is an OSError, ArrowInvalid a ValueError
        why = " ".join(str(e).split())[:200]
        raise UsageError(f"--dataset {path}: not a readable Parquet file ({why})") from None


def parquet_columns(path: str) -> list[str]:
    return next(iter(_parquet(path, None, schema_only=True)))[1]


def records(
    path: str, fmt: str, columns: Sequence[str] | None = None, max_chars: int = RECORD_CHARS
) -> Iterator[tuple[str, Any]]:
    """(where, record) for each record of the file: a dict, or a string for text (a
    line longer than `max_chars` cut to that)."""
    if fmt == "parquet":
        yield from _parquet(path, columns)
        return
    with open_text(path, "--dataset") as f:
        if fmt == "jsonl":
            yield from _jsonl(path, f)
        elif fmt == "json":
            yield from _json(path, f)
        elif fmt in ("csv", "tsv"):
            yield from _delimited(path, f, "," if fmt == "csv" else "\t")
        else:
            yield from _text(path, f, max_chars)
