"""Small text helpers every parser shares."""

from __future__ import annotations


def is_uint(text: str) -> bool:
    """ASCII digits only. str.isdigit() also accepts "²" and other digits int() refuses."""
    return text.isascii() and text.isdigit()
