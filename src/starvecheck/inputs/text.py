"""Token lengths for `pad`: a dataset file tokenized here, a file of lengths, or the
embedded Alpaca-like default. Also the one place that loads a tokenizer (local
files only: starvecheck never downloads).

Every problem with the user's input is a `UsageError` naming the file, the line or
record, and what was expected: one line, exit 2.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

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
MAX_LENGTH = 1 << 40  # a token count past this is a typo, not a document
# Memory is bounded by these, not by the largest record of the user's file.
# A record (a JSON Lines line, a CSV row's line, a JSON array file) longer than this
# is refused: it cannot be parsed in part.
RECORD_CHARS = 64 << 20
# A text sample is cut to this many characters per token of the context before it is
# tokenized: tokens of English or code average 3 to 5 characters and BPE's longest run
# to a few dozen, so what is cut away lies past the context, which training truncates.
CHARS_PER_TOKEN = 64
# Without --limit, what is held is bounded too, whatever the file unpacks to (a 14 MB
# gzip of "1\n" lines is 7 G counts, 56 GB as int64): at most MAX_LENGTHS counts of a
# --lengths file (800 MB), and samples of a dataset whose text, each sample counted
# with SAMPLE_COST characters more for what Python spends on it, is at most MAX_HELD.
# --limit N lifts both: the first N samples are read, however many that is.
MAX_LENGTHS = 100_000_000
MAX_LENGTHS_BYTES = 2 << 30  # a --lengths file's bytes (unpacked): 100 M counts are ~0.5 GB
_LIFT = "; measure the first N samples with --limit N"
MAX_LINE_CHARS = 1 << 30  # a line's characters read past its cut, at most
MAX_HELD = 2 << 30
SAMPLE_COST = 64
TOKENIZE_BATCH = 1000

Progress = Callable[[str, int, int | None], None]

# The embedded default: a log-normal cut to [13, 307] tokens whose median is 83 and
# mean 95, the figures published for 2,000 Alpaca samples (context 4,096, batch 32).
# mu and sigma were fitted so that 2,000 evenly spaced quantiles have exactly that
# median, mean, minimum and maximum.
ALPACA_MU = 4.428
ALPACA_SIGMA = 0.552
ALPACA_RANGE = (13, 307)
ALPACA_SAMPLES = 2000


def alpaca_like(n: int = ALPACA_SAMPLES, seed: int = 0) -> np.ndarray:
    """n token lengths from the Alpaca-like distribution: its quantiles at evenly
    spaced probabilities (the lowest and highest are the range's ends), shuffled with
    `seed`. The same on every run and every machine."""
    from statistics import NormalDist

    if n < 1:
        return np.zeros(0, np.int64)
    normal = NormalDist()
    low, high = (normal.cdf((np.log(end) - ALPACA_MU) / ALPACA_SIGMA) for end in ALPACA_RANGE)
    # inv_cdf is exact but scalar: evaluate at most 10,001 points and interpolate
    # between them for larger n (a smooth curve, rounded to whole tokens anyway).
    grid = min(n, 10_001)
    u = np.linspace(0.0, 1.0, grid) if grid > 1 else np.array([0.5])
    z = np.array([normal.inv_cdf(min(max(low + p * (high - low), 1e-15), 1 - 1e-15)) for p in u])
    q = np.exp(ALPACA_MU + ALPACA_SIGMA * z)
    if grid < n:
        q = np.interp(np.linspace(0.0, 1.0, n), u, q)
    lengths = np.rint(q).astype(np.int64)
    return lengths[np.random.RandomState(seed).permutation(n)]


_COUNT = re.compile(r"[0-9]+")
# --lengths is read READ_SIZE bytes at a time and parsed a block of whole lines at a
# time. A line is cut to LINE_CHARS while read (a count is a few digits: a longer line
# is refused, and a file of one huge line costs no memory); a stretch of LONG_CHARS
# with no "\n" in it is read on a line at a time (_Stretch) instead of held whole.
READ_SIZE = 1 << 20  # bytes (characters from a stream of text)
LINE_CHARS = 4096
LONG_CHARS = 1 << 20
# A block the fast parse refuses is halved down to this before the per-line reader takes
# it: a comment or a bad line costs the per-line reader a few KiB, not the whole block.
SMALL_CHARS = 8192
_FAST_DIGITS = 12  # 10**12 - 1 < MAX_LENGTH: a line of at most 12 digits needs no check


def parse_lengths(lines: Iterable[str], name: str, limit: int | None = None) -> np.ndarray:
    """One token count per line; blank lines and lines starting with # are skipped.

    The per-line reader: `read_lengths` parses whole blocks at C speed and gives the
    lines it cannot parse that way to `_count`, as this does."""
    out: list[int] = []
    for lineno, raw in enumerate(lines, 1):
        value = _count(raw, name, lineno)
        if value is None:
            continue
        out.append(value)
        if limit is not None and len(out) >= limit:
            break
    return np.array(out, dtype=np.int64)


def _count(raw: str, name: str, lineno: int) -> int | None:
    """The count on one line, None for a blank line or a comment."""
    text = raw.strip()
    if not text or text.startswith("#"):
        return None
    if not _COUNT.fullmatch(text):
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise UsageError(
            f"--lengths {name}: line {lineno}: {shown!r} is not a token count "
            "(one whole number per line)"
        )
    value = int(text)
    if value > MAX_LENGTH:
        raise UsageError(f"--lengths {name}: line {lineno}: {text[:20]} tokens is too many")
    return value


def read_lengths(path: str, stdin: IO[str] | None = None, limit: int | None = None) -> np.ndarray:
    """The counts of a --lengths file ("-": standard input), the first `limit` of them;
    with no `limit`, more than MAX_LENGTHS is one line."""
    sizes = {"long": LONG_CHARS, "small": SMALL_CHARS}  # read here: tests make them small
    most = limit if limit is not None else MAX_LENGTHS + 1
    # Blank lines and comments hold no count: bytes bound them (`yes "" |` never ends).
    bound = None if limit is not None else MAX_LENGTHS_BYTES
    if path == "-":
        f = stdin if stdin is not None else sys.stdin
        if f is None:  # started with standard input closed (`<&-`)
            raise UsageError("--lengths -: standard input is closed")
        pieces = _stream_pieces(f, "--lengths -", bound)
        counts = parse_lengths_text(pieces, "-", most, **sizes)
    else:
        with _open_binary(path, "--lengths", bound) as raw:
            pieces = _pieces(raw, f"--lengths {path}", size=READ_SIZE)
            counts = parse_lengths_text(pieces, path, most, **sizes)
    if limit is None and counts.size > MAX_LENGTHS:
        raise UsageError(
            f"--lengths {path}: more than {MAX_LENGTHS:,} lengths, more than pad holds "
            "unasked: measure the first N with --limit N"
        )
    return counts


def parse_lengths_text(
    pieces: Iterable[str],
    name: str,
    limit: int | None = None,
    cap: int = LINE_CHARS,
    long: int = LONG_CHARS,
    small: int = SMALL_CHARS,
) -> np.ndarray:
    """`parse_lengths` over the lines of a text given in pieces (cut anywhere), each line
    cut to `cap` characters as `_lines` cuts it: the same counts, or the same error.

    Lines are taken a block at a time, a block ending at a "\\n" (where the per-line
    reader starts a fresh line whatever came before; or at a "\\r" alone that ends a
    short line, see `_after_cr`): a block of numbers, blanks, comments and line ends is
    parsed whole by numpy (`_fast_counts`), any other is halved until the halves parse,
    down to `small` characters, which go through `_count` a line at a time, numbered
    on from the lines before. A line with no "\\n" in `long` characters is read on a
    line at a time (`_Stretch`), never held whole."""
    reader = _LengthsReader(name, limit, cap, small)
    pieces = iter(pieces)
    pending = ""  # the start of a line, after the last "\n" seen
    for piece in pieces:
        text = pending + piece
        end = text.rfind("\n") + 1
        if end:
            reader.block(text[:end])
            if reader.full:
                break
        pending = text[end:]
        if len(pending) > long:  # no "\n" in `long` characters
            split = _after_cr(pending, cap)
            if split:  # lines ended by "\r" alone (as classic Mac OS wrote them)
                reader.block(pending[:split])
                if reader.full:
                    break
                pending = pending[split:]
        if len(pending) > long:  # one long line
            stretch = _Stretch(pending, pieces)
            reader.lines(stretch)
            if reader.full:
                break
            pending = stretch.rest
    else:
        if pending:  # the last line, without its "\n"
            reader.block(pending)
    return reader.counts()


def _after_cr(text: str, cap: int) -> int:
    """Where text without a "\\n" can be cut into blocks: after its last "\\r" (not
    the final character, which may begin a "\\r\\n") if the line it ends is shorter
    than `cap` (the per-line reader starts afresh after it, as after a "\\n"); 0 if
    nowhere."""
    at = text.rfind("\r", 0, len(text) - 1)
    if at < 0 or at - text.rfind("\r", 0, at) >= cap:
        return 0
    return at + 1


class _LengthsReader:
    """The counts read so far, the lines they came from, and where to stop."""

    def __init__(self, name: str, limit: int | None, cap: int, small: int) -> None:
        self.name, self.limit, self.cap, self.small = name, limit, cap, small
        self.parts: list[np.ndarray] = []
        self.n = 0  # counts so far
        self.lineno = 0  # lines so far

    @property
    def full(self) -> bool:
        return self.limit is not None and self.n >= self.limit

    def add(self, values: np.ndarray, lines: int) -> None:
        if self.limit is not None:
            values = values[: self.limit - self.n]
        self.parts.append(values)
        self.n += values.size
        self.lineno += lines

    def block(self, text: str) -> None:
        """Whole lines (the last one may lack its "\\n" at the end of the file)."""
        fast = _fast_counts(text, self.cap)
        if fast is not None:
            self.add(*fast)
            return
        if len(text) > self.small:
            half = len(text) // 2
            cut = text.rfind("\n", 0, half) + 1 or text.find("\n", half) + 1
            if 0 < cut < len(text):
                self.block(text[:cut])
                if not self.full:
                    self.block(text[cut:])
                return
        self.lines(io.StringIO(text, newline=""))

    def lines(self, f: IO[str] | _Stretch) -> None:
        """The per-line reader, on lines the fast parse refused, numbered on."""
        out: list[int] = []
        lineno = 0
        for lineno, line, _ in _lines(f, self.cap, name=f"--lengths {self.name}"):
            value = _count(line, self.name, self.lineno + lineno)
            if value is not None:
                out.append(value)
                if self.limit is not None and self.n + len(out) >= self.limit:
                    break
        self.add(np.array(out, dtype=np.int64), lineno)

    def counts(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)


_COMMENT = re.compile(r"^[ \t]*#[^\r\n]*", re.MULTILINE)  # up to the line's end


def _fast_counts(text: str, cap: int) -> tuple[np.ndarray, int] | None:
    """(counts, lines) of whole lines that hold only a number of at most 12 digits
    between blanks, a comment, or nothing, parsed by numpy; None for anything else (a
    sign, a long line, non-ASCII outside a comment, ...), which the per-line reader
    decides."""
    if "#" in text:  # comment lines go (a "#" anywhere else stays, and is refused below)
        comments = _COMMENT.findall(text)
        if max(map(len, comments), default=0) >= cap - 1:
            return None  # one the per-line reader would cut
        text = _COMMENT.sub("", text)
    if not text.isascii():
        return None
    raw = text.encode("ascii")
    other = raw.translate(None, b"0123456789 \t\n")
    if other.strip(b"\r"):
        return None  # something else than digits, blanks and line ends
    if other:  # "\r\n", or "\r" alone, ends a line as "\n" does
        raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if not raw:
        return np.zeros(0, np.int64), 0
    a = np.frombuffer(raw, np.uint8)
    ends = np.flatnonzero(a == 10)  # where each line's "\n" is
    if raw[-1:] != b"\n":  # the file's last line, without its "\n"
        ends = np.append(ends, a.size)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if int((ends - starts).max()) >= cap - 2:
        return None  # a line the per-line reader might cut (its end counted as 2)
    digit = a >= 48  # after the check above, only digits are at or past "0"
    before = np.concatenate(([0], np.cumsum(digit)))  # digits before each position
    digits = before[ends] - before[starts]  # digits on each line
    if int(digits.max()) > _FAST_DIGITS:
        return None
    numbers = int(np.count_nonzero(digits))
    if numbers == 0:
        return np.zeros(0, np.int64), int(ends.size)
    if b" " in raw or b"\t" in raw:
        # blanks: one run of digits a line, or a line like "1 2" would read as two
        runs = int(np.count_nonzero(digit[1:] & ~digit[:-1])) + int(digit[0])
        if runs != numbers:
            return None
    values = np.fromstring(raw, dtype=np.int64, sep=" ")  # whitespace between numbers
    if values.size != numbers:
        return None
    return values, int(ends.size)


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


_LINE_END = re.compile(r"[\r\n]")


class _Stretch:
    """The text from a line's start to the next "\\n" (or the end of the file), for the
    per-line reader (`_lines`) without holding it whole: a line longer than a block
    (with no short line ended by "\\r" alone to cut at, see `_after_cr`). Reads on from
    `pieces` as it goes; what followed the "\\n" is left in `rest`."""

    def __init__(self, text: str, pieces: Iterator[str]) -> None:
        self.text, self.at, self.pieces = text, 0, pieces
        self.ended = False  # `text` runs to the stretch's end
        self.rest = ""

    def readline(self, size: int) -> str:
        while not self.ended and len(self.text) - self.at <= size:
            piece = next(self.pieces, None)
            if piece is None:
                self.ended = True
                break
            newline = piece.find("\n")
            if newline >= 0:
                piece, self.rest = piece[: newline + 1], piece[newline + 1 :]
                self.ended = True
            self.text = self.text[self.at :] + piece
            self.at = 0
        # Up to the first line end and one character past it, at most one past `size`
        # (a "\r" may be the start of a "\r\n"): StringIO's readline then ends or cuts
        # the line as the file's readline does.
        end = self.at + size + 1
        found = _LINE_END.search(self.text, self.at, end)
        if found is not None:
            end = min(end, found.end() + 1)
        line = io.StringIO(self.text[self.at : end], newline="").readline(size)
        self.at += len(line)
        return line


# --- records ----------------------------------------------------------------------


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


# --- samples ----------------------------------------------------------------------

Sample = str | int | list  # text, a token count (pre-tokenized), or chat messages


@dataclass
class Samples:
    """What was read: one entry per sample, and what had to be assumed on the way."""

    items: list[Sample] = field(default_factory=list)
    fields: tuple[str, ...] = ()
    missing: dict[str, int] = field(default_factory=dict)  # field -> records without it
    records: int = 0
    cut: int = 0  # texts cut to max_chars before tokenizing

    @property
    def pretokenized(self) -> bool:
        return bool(self.items) and all(isinstance(s, int) for s in self.items)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value[:64]
    )


def _is_chat(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and "content" in m for m in value[:64])
    )


def _value(path: str, where: str, name: str, value: Any) -> Sample:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if _is_ids(value) and value:
        return len(value)
    if _is_chat(value):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    kinds = {bool: "a boolean", int: "a number", float: "a number", dict: "an object"}
    kind = kinds.get(type(value), f"a {type(value).__name__}")
    raise UsageError(
        f"--dataset {path}: {where}: field {name!r} holds {kind}; --field names text, "
        "token ids or chat messages"
    )


def read_samples(
    path: str,
    fmt: str,
    fields: Sequence[str],
    limit: int | None = None,
    max_chars: int = RECORD_CHARS,
) -> Samples:
    """The samples of a dataset file: each record's fields joined by a newline, each
    text cut to `max_chars` (pad passes what its context can hold: `CHARS_PER_TOKEN`
    per token), so memory is bounded by the context and not by the longest record.

    With no --field: `text` if the first record has it, else `input_ids`, else an
    error listing the fields there are. A field may hold text, token ids (counted,
    not tokenized) or chat messages (a list of {"role", "content"})."""
    max_chars = min(max_chars, RECORD_CHARS)
    if fmt == "text":
        return _text_samples(path, fields, limit, max_chars)
    out = Samples(fields=tuple(fields))
    held = 0  # characters held, for MAX_HELD
    chosen: tuple[str, ...] = tuple(fields)
    columns: Sequence[str] | None = chosen or None
    if not chosen and fmt == "parquet":  # read one column, not the whole table
        names = parquet_columns(path)
        columns = next(([g] for g in ("text", "input_ids") if g in names), names[:1])
    for where, record in records(path, fmt, columns):
        if not isinstance(record, dict):
            kind = "a list" if isinstance(record, list) else type(record).__name__
            raise UsageError(
                f"--dataset {path}: {where}: expected an object with named fields, found {kind}"
            )
        if not chosen:
            for guess in ("text", "input_ids"):
                if guess in record:
                    chosen = (guess,)
                    break
            else:
                raise UsageError(
                    f"--dataset {path}: no 'text' field; name the field(s) to measure with "
                    f"--field (the first record has: {_names(record)})"
                )
            out.fields = chosen
        if out.records == 0:
            absent = [f for f in chosen if f not in record]
            if len(absent) == len(chosen):
                raise UsageError(
                    f"--field {', '.join(absent)}: not in {path} (the first record has: "
                    f"{_names(record)})"
                )
        out.records += 1
        parts: list[Sample] = []
        for name in chosen:
            if name not in record:
                out.missing[name] = out.missing.get(name, 0) + 1
                continue
            parts.append(_value(path, where, name, record[name]))
        joined = _join(path, where, parts)
        if isinstance(joined, str) and len(joined) > max_chars:
            joined = joined[:max_chars]
            out.cut += 1
        out.items.append(joined)
        if limit is not None and out.records >= limit:
            break
        held = _held(path, held, joined, limit)
    if not out.items:
        raise UsageError(f"--dataset {path}: no records")
    for name, n in out.missing.items():
        if n == out.records:
            raise UsageError(f"--field {name}: in no record of {path}")
    return out


def _text_samples(path: str, fields: Sequence[str], limit: int | None, max_chars: int) -> Samples:
    """A plain text file's samples: one a line, blank lines skipped."""
    if fields:
        raise UsageError(
            f"--field: {path} is plain text, one sample per line; --field applies to "
            "JSON Lines, JSON, Parquet and CSV (use --format to say which it is)"
        )
    out = Samples()
    held = 0
    for _, line in records(path, "text", max_chars=max_chars):
        out.items.append(str(line))
        out.cut += isinstance(line, _Cut)
        out.records += 1
        if limit is not None and out.records >= limit:
            break
        held = _held(path, held, line, limit)
    if not out.items:
        raise UsageError(f"--dataset {path}: no samples (every line is blank)")
    return out


def _held(path: str, held: int, sample: Sample, limit: int | None) -> int:
    """`held` and this sample's share (its text's characters and SAMPLE_COST); past
    MAX_HELD with no --limit, one line."""
    if isinstance(sample, str):
        held += len(sample)
    elif isinstance(sample, list):  # chat messages
        held += sum(len(str(m.get("content") or "")) for m in sample if isinstance(m, dict))
    held += SAMPLE_COST
    if limit is None and held > MAX_HELD:
        raise UsageError(
            f"--dataset {path}: more than {MAX_HELD >> 30} Gi characters of samples, more "
            "than pad holds unasked: measure the first N with --limit N"
        )
    return held


def _names(record: dict[str, Any]) -> str:
    names = list(record)
    shown = ", ".join(str(n) for n in names[:12])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 12 else "") or "no fields"


def _join(path: str, where: str, parts: list[Sample]) -> Sample:
    if len(parts) == 1:
        return parts[0]
    if any(not isinstance(p, str) for p in parts):
        raise UsageError(
            f"--dataset {path}: {where}: only text fields can be joined; token ids and chat "
            "messages go in a --field of their own"
        )
    return "\n".join(p for p in parts if isinstance(p, str))


# --- tokenizing -------------------------------------------------------------------


def default_texts(n: int, chars: int = 2000) -> list[str]:
    """Real English prose without a download: docstrings of the standard library's
    own modules, cut into samples of about `chars` characters."""
    import ast
    import os
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    texts: list[str] = []
    buf = ""
    for name in sorted(os.listdir(stdlib)):
        if not name.endswith(".py"):
            continue
        try:
            with open(os.path.join(stdlib, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    buf += " " + " ".join(doc.split())
                    while len(buf) >= chars:
                        texts.append(buf[:chars])
                        buf = buf[chars:]
                        if len(texts) >= n:
                            return texts
    return texts or ["starvecheck " * (chars // 12)]


def load_tokenizer(name: str) -> Any:
    """A transformers tokenizer from local files only: starvecheck never downloads.
    NAME is a directory holding tokenizer.json (or the files of a slow tokenizer), a
    lone tokenizer.json file, or a model name already in the local Hugging Face cache."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        with importing():
            from transformers import AutoTokenizer
    except ImportError as e:
        raise UsageError("--tokenizer needs transformers: pip install 'starvecheck[text]'") from e
    if os.path.isfile(name):  # a lone tokenizer.json, as `tokenizer.save("...")` writes it
        with importing():
            from transformers import PreTrainedTokenizerFast

        try:
            return PreTrainedTokenizerFast(tokenizer_file=name)
        except Exception as e:
            raise UsageError(f"--tokenizer {name}: not a tokenizer.json ({_why(e)})") from e
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as e:  # transformers raises OSError, ValueError, ... by case
        raise UsageError(
            f"--tokenizer {name}: no tokenizer found in local files (starvecheck never "
            f"downloads; pass a directory with tokenizer.json): {_why(e)}"
        ) from e


def _why(e: BaseException) -> str:
    """An exception as one short line: its class, and its message where it has one."""
    text = " ".join(str(e).split())
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def token_lengths(
    samples: Sequence[Sample],
    tokenizer: Any,
    progress: Progress | None = None,
    batch: int = TOKENIZE_BATCH,
) -> np.ndarray:
    """Token count of each sample as the model would see it: special tokens added for
    text; chat messages through the tokenizer's chat template when it has one."""
    out = np.zeros(len(samples), np.int64)
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        texts: list[str] = []
        chats: list[str] = []
        where_text: list[int] = []
        where_chat: list[int] = []
        for i, s in enumerate(chunk, start):
            if isinstance(s, int):
                out[i] = s
            elif isinstance(s, str):
                texts.append(s)
                where_text.append(i)
            elif template:
                chats.append(tokenizer.apply_chat_template(s, tokenize=False))
                where_chat.append(i)
            else:  # no template: the messages' text, one per line
                texts.append("\n".join(str(m.get("content") or "") for m in s))
                where_text.append(i)
        for where, batch_texts, special in (
            (where_text, texts, True),
            (where_chat, chats, False),  # the template already holds the special tokens
        ):
            if batch_texts:
                try:
                    ids = tokenizer(
                        batch_texts,
                        add_special_tokens=special,
                        return_attention_mask=False,
                        return_token_type_ids=False,
                        verbose=False,
                    )["input_ids"]
                except Exception as e:  # a tokenizer's own failure, on the user's text
                    raise UsageError(
                        f"--tokenizer: tokenizing samples {where[0] + 1:,} to {where[-1] + 1:,} "
                        f"failed: {_why(e)}"
                    ) from e
                out[where] = [len(x) for x in ids]
        if progress is not None:
            progress("tokenizing", min(start + batch, len(samples)), len(samples))
    return out
