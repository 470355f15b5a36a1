"""A dataset file's records, from the six formats `pad --dataset` reads (JSON Lines,
JSON, Parquet, CSV, TSV, plain text; gzipped or not), and the bounded text streams
under them, which the lengths reader shares. A user's file is untrusted and may be of
any size: a record is parsed whole only up to RECORD_CHARS, a line is cut while it is
read, and bytes that are not UTF-8 or a broken gzip stream end in one line naming the
file and where in it, exit 2, never a traceback.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
from collections.abc import Iterator, Sequence
from typing import IO, Any

from starvecheck.core.signals import importing
from starvecheck.core.status import UsageError
from starvecheck.inputs.files import STDIN, check, open_input

FORMATS = ("jsonl", "json", "parquet", "csv", "tsv", "text")
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
MAX_LINE_CHARS = 1 << 30  # a line's characters read past its cut, at most
READ_SIZE = 1 << 20  # bytes (characters from a stream of text) a read
# What a byte limit's line adds: --limit N lifts the bound.
_LIFT = "; measure the first N samples with --limit N"


def detect_format(path: str) -> str:
    name = path.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return _SUFFIXES.get(os.path.splitext(name)[1], "text")


def _open_binary(path: str, option: str, limit: int | None = None) -> IO[bytes]:
    """The file, checked first (a FIFO, a device, a socket or a directory is one line,
    before anything opens it; a pipe the shell hands over is read with an idle time
    limit: starvecheck.inputs.files), gunzipped where its name ends in .gz; more than `limit`
    bytes (unpacked) is one line."""
    zipped = path.lower().endswith(".gz")
    return open_input(path, f"{option} {path}", limit, _LIFT, gunzip=zipped)


def _open_text(path: str, option: str) -> IO[str]:
    return _Checked(_open_binary(path, option), f"{option} {path}")


# What reading a user's file can raise: bytes that are not UTF-8, a disk or gzip error
# (gzip.BadGzipFile is an OSError), a gzip stream cut short (EOFError).
_READ_ERRORS = (UnicodeDecodeError, OSError, EOFError)


def _unreadable(where: str, e: BaseException, encoding: str = "UTF-8") -> UsageError:
    if isinstance(e, UnicodeDecodeError):
        return UsageError(f"{where}: not {encoding} text ({e.reason})")
    return UsageError(f"{where}: cannot read: {e}")


class _Checked(io.TextIOWrapper):
    """UTF-8 text whose decoding and gzip errors become one usage line.

    A plain try in each read, not a context manager: a read is one line, and entering
    a context manager per line cost more than reading the line (a text dataset read
    line by line took 2.6x as long with one)."""

    def __init__(self, raw: IO[bytes], where: str) -> None:
        # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first field.
        super().__init__(raw, encoding="utf-8-sig", newline="")  # type: ignore[arg-type]
        self._where = where

    def __next__(self) -> str:
        try:
            return super().__next__()
        except _READ_ERRORS as e:
            raise _unreadable(self._where, e) from None

    def readline(self, size: int | None = -1) -> str:
        try:
            return super().readline(size)
        except _READ_ERRORS as e:
            raise _unreadable(self._where, e) from None

    def read(self, size: int | None = -1) -> str:
        try:
            return super().read(size)
        except _READ_ERRORS as e:
            raise _unreadable(self._where, e) from None


def _pieces(
    raw: IO[bytes],
    where: str,
    encoding: str = "utf-8-sig",
    errors: str = "strict",
    size: int = READ_SIZE,
) -> Iterator[str]:
    """The text of a binary file, `size` bytes at a time. A read error, or bytes
    that are not text, end it with one usage line, after the text before them (so a
    --limit met before them stops first, as it did when the file was read a line at
    a time)."""
    decoder = codecs.getincrementaldecoder(encoding)(errors)
    read = getattr(raw, "read1", raw.read)  # read1: what a pipe has, without waiting for more
    name = "UTF-8" if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig") else encoding
    while True:
        try:
            data = read(size)
        except _READ_ERRORS as e:
            raise _unreadable(where, e) from None
        bad = None
        try:
            text = decoder.decode(data, final=not data)
        except UnicodeDecodeError as e:
            text, bad = _decoded_before(e), _unreadable(where, e, name)
        if text:
            yield text
        if bad is not None:
            raise bad
        if not data:
            return


def _decoded_before(e: UnicodeDecodeError) -> str:
    """The text before the bytes that could not be decoded."""
    try:
        return e.object[: e.start].decode(e.encoding)
    except (UnicodeDecodeError, LookupError):
        return ""


def _stream_pieces(f: IO[str], where: str, limit: int | None = None) -> Iterator[str]:
    """The pieces of a text stream (standard input). Its bytes where it has them, read
    as they come and decoded as the stream would; text from a stream without (a test's
    StringIO)."""
    buffer = getattr(f, "buffer", None)
    encoding = getattr(f, "encoding", None)
    if buffer is not None and isinstance(encoding, str):
        # Its descriptor, read with starvecheck.inputs.files' idle time limit: a terminal or a
        # pipe that never ends is one line, not a wait for ever; a device is refused.
        with open_input(STDIN, where, limit, _LIFT, gunzip=False, stdin=f) as raw:
            yield from _pieces(raw, where, encoding, getattr(f, "errors", None) or "strict")
        return
    while True:
        try:
            text = f.read(READ_SIZE)
        except _READ_ERRORS as e:
            raise _unreadable(where, e) from None
        if not text:
            return
        yield text


def _lines(
    f: IO[str], cap: int, refuse: str | None = None, name: str = "the input"
) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, whether it was cut) for each line, never holding more than
    `cap` characters of one: a longer line is cut to its first `cap` (the rest read
    and dropped in pieces, up to MAX_LINE_CHARS: a stream with no line end, such as
    NUL bytes from a pipe, is no text), or, where `refuse` names the file, refused in
    one line."""
    lineno = 0
    while True:
        line = f.readline(cap)
        if not line:
            return
        lineno += 1
        if len(line) < cap or line.endswith("\n"):
            yield lineno, line, False
            continue
        if refuse is not None:
            raise UsageError(
                f"{refuse}: line {lineno} is over {cap >> 20} Mi characters, more than "
                "starvecheck reads as one record (memory stays bounded whatever the file); "
                "split such records, or measure their token counts with --lengths"
            )
        rest, dropped = line, 0
        while len(rest) == cap and not rest.endswith("\n"):
            rest = f.readline(cap)
            dropped += len(rest)
            if dropped > MAX_LINE_CHARS:
                raise UsageError(
                    f"{name}: line {lineno} goes on past {MAX_LINE_CHARS:,} characters "
                    "with no line end: not text"
                )
        yield lineno, line, True


def _jsonl(path: str, f: IO[str]) -> Iterator[tuple[str, Any]]:
    for lineno, line, _ in _lines(f, RECORD_CHARS, f"--dataset {path}"):
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
    lines = (line for _, line, _ in _lines(f, RECORD_CHARS, f"--dataset {path}"))
    reader = csv.DictReader(lines, delimiter=delimiter)
    try:
        for row in reader:
            yield f"line {reader.line_num}", row
    except csv.Error as e:
        raise UsageError(f"--dataset {path}: line {reader.line_num}: {e}") from None


def _text(path: str, f: IO[str], max_chars: int) -> Iterator[tuple[str, Any]]:
    for lineno, line, cut in _lines(f, max_chars, name=f"--dataset {path}"):
        text = line.rstrip("\r\n")
        if text.strip():
            yield f"line {lineno}", _Cut(text) if cut else text


class _Cut(str):
    """A text cut to its first characters while it was read (`_lines`)."""


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
        with importing():
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
    with _open_text(path, "--dataset") as f:
        if fmt == "jsonl":
            yield from _jsonl(path, f)
        elif fmt == "json":
            yield from _json(path, f)
        elif fmt in ("csv", "tsv"):
            yield from _delimited(path, f, "," if fmt == "csv" else "\t")
        else:
            yield from _text(path, f, max_chars)
