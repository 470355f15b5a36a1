"""Small text helpers every parser shares."""

from __future__ import annotations

from starvecheck.core.units import parse_uint


def is_uint(text: str) -> bool:
    """ASCII digits only, at most 20 (core/units.parse_uint: str.isdigit() also accepts
    "²" and other digits int() refuses, and int() refuses 4,300 digits)."""
    return parse_uint(text) is not None
