"""Token lengths counted elsewhere, as `pad --lengths FILE` (or "-", standard input)
takes them: one whole number a line, as a tokenizer run on the training machine writes
them. Such a file runs to millions of lines, too many to parse one at a time in Python,
so it is parsed a block at a time by numpy; every block that parse refuses goes to the
per-line reader, which decides, so the counts and every error are what reading a line at
a time gave (docs/performance.md, "Reading `pad --lengths`").

Every problem is a `UsageError` naming the file, the line, and what was expected: one
line, exit 2.
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterable, Iterator
from typing import IO

import numpy as np

from starvecheck.core.status import UsageError
from starvecheck.inputs.streams import (
    READ_SIZE,
    bounded_lines,
    open_binary,
    stream_pieces,
    text_pieces,
)

MAX_LENGTH = 1 << 40  # a token count past this is a typo, not a document
# Without --limit, what is held is bounded whatever the file unpacks to (a 14 MB gzip
# of "1\n" lines is 7 G counts, 56 GB as int64): at most MAX_LENGTHS counts (800 MB).
# --limit N lifts it: the first N counts are read, however many that is.
MAX_LENGTHS = 100_000_000
MAX_LENGTHS_BYTES = 2 << 30  # a --lengths file's bytes (unpacked): 100 M counts are ~0.5 GB

_COUNT = re.compile(r"[0-9]+")
# --lengths is read READ_SIZE bytes at a time and parsed a block of whole lines at a
# time. A line is cut to LINE_CHARS while read (a count is a few digits: a longer line
# is refused, and a file of one huge line costs no memory); a stretch of LONG_CHARS
# with no "\n" in it is read on a line at a time (_Stretch) instead of held whole.
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
        pieces = stream_pieces(f, "--lengths -", bound)
        counts = parse_lengths_text(pieces, "-", most, **sizes)
    else:
        with open_binary(path, "--lengths", bound) as raw:
            pieces = text_pieces(raw, f"--lengths {path}", size=READ_SIZE)
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
    cut to `cap` characters as `bounded_lines` cuts it: the same counts, or the same error.

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
        for lineno, line, _ in bounded_lines(f, self.cap, name=f"--lengths {self.name}"):
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


_LINE_END = re.compile(r"[\r\n]")


class _Stretch:
    """The text from a line's start to the next "\\n" (or the end of the file), for the
    per-line reader (`bounded_lines`) without holding it whole: a line longer than a block
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
