"""Formatting of sizes and rates for people; binary units for memory, as the kernel uses."""

from __future__ import annotations

import re

_BINARY = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in _BINARY:
        if abs(n) >= size:
            value = n / size
            return (
                f"{value:.0f} {unit}"
                if value >= 100 or value == int(value)
                else f"{value:.1f} {unit}"
            )
    return f"{int(n)} B"


# 2**64 - 1 has 20 digits: nothing we read from outside is larger. int() of a longer
# string is slow, and past 4,300 digits a ValueError (Python 3.11's limit).
MAX_DIGITS = 20


def parse_uint(text: str) -> int | None:
    """A whole number written in ASCII digits alone, at most 20 of them; None for
    anything else. Not str.isdigit (True for "²", which int() refuses), not int() (it
    takes "٣", " 1", "+1" and "1_0"): the one parser for counts and ranks read from
    another process, a tool's output or the environment."""
    if not 0 < len(text) <= MAX_DIGITS or not text.isascii() or not text.isdigit():
        return None
    return int(text)


_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """ "16K", "4MiB", "1.5G", "512" -> bytes (binary multiples, as dd and fio read them)."""
    m = _SIZE_RE.fullmatch(text)
    if not m:
        return None
    mult = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[m.group(2).lower()]
    try:
        return int(float(m.group(1)) * mult)
    except (OverflowError, ValueError):  # 1e400 is inf as a float: no size at all
        return None


def size_name(size: int) -> str:
    """64 KiB -> "64KiB", 256 MiB -> "256MiB", 1 GiB -> "1GiB": how sizes are named in
    metric names and tables. Sizes that are no whole multiple of a KiB are named in
    bytes ("1000B")."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"
