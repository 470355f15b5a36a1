"""What the Python versions this package supports (pyproject's requires-python) spell
differently: `StrEnum` is the standard library's from Python 3.11 and written here for
3.10, with the same str(), format() and comparisons (a member is its value)."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, Enum):
        """enum.StrEnum of Python 3.11: members are strings, shown as their values."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(self, spec)


__all__ = ["StrEnum"]
