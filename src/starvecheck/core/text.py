"""Text from outside, shown without harm: the one escape every error line and every
renderer uses, and output that a terminal's encoding cannot take written in ASCII
instead of failing.

Paths, mount points, the names a user's factory or a trace gives, a marker's lines:
any of them may hold an escape sequence (one that recolours or retitles the terminal),
a newline that fakes a line of the report, or the bytes of a name that are not UTF-8.
`printable` shows each such character as an escape; `escaped` applies it to every
string of a report before a renderer lays it out (JSON needs neither: json escapes).

A C or Latin-1 locale (LC_ALL=C with PYTHONUTF8=0, PYTHONIOENCODING=latin-1) cannot
encode the report's own "…", "·" or "σ": `readable` makes a stream write those as
ASCII look-alikes ("...", "-", "sd") rather than raise at the end of a measurement.
"""

from __future__ import annotations

import codecs
import contextlib
import unicodedata
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from enum import Enum
from typing import Any, TypeVar

from starvecheck.core.metric import Caveat

T = TypeVar("T")


def printable(text: str, keep: str = "") -> str:
    """`text` with every character a terminal would act on shown as an escape: control
    characters and newlines as \\n, \\x1b, ...; the bytes of a file name that are not
    UTF-8 (os.fsdecode's surrogates) as \\xff; printable text of any script as is.
    `keep`: characters left as they are (Markdown keeps newlines, which its table
    cells turn into blanks)."""
    if text.isprintable():
        return text
    return "".join(
        ch
        if ch.isprintable() or ch == " " or ch in keep
        else f"\\x{ord(ch) - 0xDC00:02x}"
        if 0xDC80 <= ord(ch) <= 0xDCFF
        else ch.encode("unicode_escape", "backslashreplace").decode("ascii")
        for ch in text
    )


def escaped(value: T, keep: str = "") -> T:
    """`value` (a Report, or any part of one) with `printable` applied to every string
    in it, keys included, through dataclasses, mappings, lists and tuples; enums,
    numbers and anything else as they are. What renderers lay out, so a cell's width
    is that of what is shown."""
    return _escaped(value, keep)  # type: ignore[no-any-return]


def _escaped(value: Any, keep: str) -> Any:
    if isinstance(value, Enum) or value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, Caveat):
        return Caveat(value.id, printable(value.text, keep))
    if isinstance(value, str):
        return printable(value, keep)
    if is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _escaped(getattr(value, f.name), keep) for f in fields(value) if f.init}
        return replace(value, **changes)
    if isinstance(value, Mapping):
        return {_escaped(k, keep): _escaped(v, keep) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_escaped(v, keep) for v in value)
    return value


# What the report itself writes beyond ASCII, in the ASCII a C locale can take.
ASCII = {
    "…": "...",
    "·": "-",
    "σ": "sd",
    "→": "->",
    "←": "<-",
    "≥": ">=",
    "≤": "<=",
    "≈": "~",
    "×": "x",
    "—": "-",
    "–": "-",
    "±": "+/-",
    "µ": "u",
    "μ": "u",
    "✓": "ok",
    "⚠": "!",
    "\ufe0f": "",  # the variation selector after ⚠ (an emoji, not a symbol)
    "✅": "[ok]",
    "🔴": "[critical]",
    "🟠": "[warning]",
    "🔵": "[info]",
}
ERRORS = "starvecheck-ascii"


def _ascii(ch: str) -> str:
    """One character the stream cannot encode, as ASCII: a look-alike, its letters
    without their accents (é -> e), else its escape (\\u4e2d)."""
    if ch in ASCII:
        return ASCII[ch]
    if 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte of a name that is not UTF-8
        return f"\\x{ord(ch) - 0xDC00:02x}"
    plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii")
    return plain or ch.encode("ascii", "backslashreplace").decode("ascii")


def _handler(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start : error.end]
    return "".join(_ascii(ch) for ch in bad), error.end


codecs.register_error(ERRORS, _handler)


def readable(stream: object) -> None:
    """Make a text stream whose encoding is not UTF-8 write what it cannot encode as
    ASCII (`_ascii`) instead of raising UnicodeEncodeError. Streams of other kinds
    (StringIO, a closed or detached one) are left as they are."""
    encoding = getattr(stream, "encoding", None)
    reconfigure = getattr(stream, "reconfigure", None)
    if not encoding or reconfigure is None:
        return
    try:
        if codecs.lookup(encoding).name in ("utf-8", "utf-16", "utf-32"):
            return
    except LookupError:
        pass
    # Closed, or a stream whose reconfigure refuses: as it was.
    with contextlib.suppress(ValueError, OSError, AttributeError):
        reconfigure(errors=ERRORS)
