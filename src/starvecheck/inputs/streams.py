"""Text from a user's file or standard input, read bounded: the streams under every
reader of inputs/ (records.py's six formats, lengths.py's block reader). A user's
file is untrusted and may be of any size: it is checked before it is opened
(files.py), read READ_SIZE bytes at a time, a line is cut while it is read, and bytes
that are not UTF-8 or a broken gzip stream end in one line naming the file and where
in it, exit 2, never a traceback.
"""

from __future__ import annotations

import codecs
import io
from collections.abc import Iterator
from typing import IO

from starvecheck.core.status import UsageError
from starvecheck.inputs.files import STDIN, open_input

MAX_LINE_CHARS = 1 << 30  # a line's characters read past its cut, at most
READ_SIZE = 1 << 20  # bytes (characters from a stream of text) a read
# What a byte limit's line adds: --limit N lifts the bound.
LIFT = "; measure the first N samples with --limit N"


def open_binary(path: str, option: str, limit: int | None = None) -> IO[bytes]:
    """The file, checked first (a FIFO, a device, a socket or a directory is one line,
    before anything opens it; a pipe the shell hands over is read with an idle time
    limit: starvecheck.inputs.files), gunzipped where its name ends in .gz; more than `limit`
    bytes (unpacked) is one line."""
    zipped = path.lower().endswith(".gz")
    return open_input(path, f"{option} {path}", limit, LIFT, gunzip=zipped)


def open_text(path: str, option: str) -> IO[str]:
    return Checked(open_binary(path, option), f"{option} {path}")


# What reading a user's file can raise: bytes that are not UTF-8, a disk or gzip error
# (gzip.BadGzipFile is an OSError), a gzip stream cut short (EOFError).
READ_ERRORS = (UnicodeDecodeError, OSError, EOFError)


def unreadable(where: str, e: BaseException, encoding: str = "UTF-8") -> UsageError:
    if isinstance(e, UnicodeDecodeError):
        return UsageError(f"{where}: not {encoding} text ({e.reason})")
    return UsageError(f"{where}: cannot read: {e}")


class Checked(io.TextIOWrapper):
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
        except READ_ERRORS as e:
            raise unreadable(self._where, e) from None

    def readline(self, size: int | None = -1) -> str:
        try:
            return super().readline(size)
        except READ_ERRORS as e:
            raise unreadable(self._where, e) from None

    def read(self, size: int | None = -1) -> str:
        try:
            return super().read(size)
        except READ_ERRORS as e:
            raise unreadable(self._where, e) from None


def text_pieces(
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
        except READ_ERRORS as e:
            raise unreadable(where, e) from None
        bad = None
        try:
            text = decoder.decode(data, final=not data)
        except UnicodeDecodeError as e:
            text, bad = _decoded_before(e), unreadable(where, e, name)
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


def stream_pieces(f: IO[str], where: str, limit: int | None = None) -> Iterator[str]:
    """The pieces of a text stream (standard input). Its bytes where it has them, read
    as they come and decoded as the stream would; text from a stream without (a test's
    StringIO)."""
    buffer = getattr(f, "buffer", None)
    encoding = getattr(f, "encoding", None)
    if buffer is not None and isinstance(encoding, str):
        # Its descriptor, read with starvecheck.inputs.files' idle time limit: a terminal or a
        # pipe that never ends is one line, not a wait for ever; a device is refused.
        with open_input(STDIN, where, limit, LIFT, gunzip=False, stdin=f) as raw:
            yield from text_pieces(raw, where, encoding, getattr(f, "errors", None) or "strict")
        return
    while True:
        try:
            text = f.read(READ_SIZE)
        except READ_ERRORS as e:
            raise unreadable(where, e) from None
        if not text:
            return
        yield text


def bounded_lines(
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


class Cut(str):
    """A text cut to its first characters while it was read (`bounded_lines`)."""
