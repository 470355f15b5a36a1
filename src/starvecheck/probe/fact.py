"""A probed fact: a value, or unknown/not applicable with the reason.

Probes never raise. A missing or garbled file in /proc or /sys is normal on some
machine somewhere, so each probe returns a `Fact` and the reason travels with it
into the report (`machine.unknown` / `machine.not_applicable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Fact(Generic[T]):
    value: T | None
    reason: str | None = None
    # True when there is no value because the thing does not exist here (no CPU
    # quota, no GPU), not because it could not be read: collect_env's distinction.
    not_applicable: bool = False

    @classmethod
    def of(cls, value: T) -> Fact[T]:
        return cls(value)

    @classmethod
    def unknown(cls, reason: str) -> Fact[T]:
        return cls(None, reason)

    @classmethod
    def absent(cls, reason: str) -> Fact[T]:
        return cls(None, reason, not_applicable=True)

    @property
    def known(self) -> bool:
        return self.value is not None


class Ledger:
    """Collects the reasons behind every null in a machine record, by dotted key."""

    def __init__(self) -> None:
        self.unknown: dict[str, str] = {}
        self.not_applicable: dict[str, str] = {}

    def take(self, key: str, fact: Fact[T]) -> T | None:
        if fact.value is None:
            target = self.not_applicable if fact.not_applicable else self.unknown
            target[key] = fact.reason or "not measured"
        return fact.value
