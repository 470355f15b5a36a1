"""Judging: results in, findings out, and the one ranking every command uses.

The checklist orders findings by estimated gain (blockers first, then the share
of time a fix would recover), then by severity; findings that are `ok` are
checks that passed and are not on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from starvecheck.core.model import Finding, Severity


def rank(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    todo: dict[str, Finding] = {}
    for f in findings:
        if f.severity is Severity.OK:
            continue
        # The same finding from two stages (doctor runs several) is listed once:
        # keep the one with the larger gain.
        kept = todo.get(f.id)
        if kept is None or _key(f) < _key(kept):
            todo[f.id] = f
    return tuple(sorted(todo.values(), key=_key))


def _key(f: Finding) -> tuple[float, int, str]:
    # A gain not estimated ranks with a measured zero: severity orders them.
    score = f.gain.score if f.gain else 0.0
    return (-score, -f.severity.rank, f.id)


def verdict(checklist: tuple[Finding, ...], checked: int) -> str:
    """One line, as pyperf's system check ends: what to do first, or that all is well."""
    if not checklist:
        return f"All {checked} checks passed." if checked else "Nothing to check."
    counts = {s: sum(1 for f in checklist if f.severity is s) for s in Severity}
    parts = [
        _plural(counts[s], s.value)
        for s in (Severity.CRITICAL, Severity.WARNING, Severity.INFO)
        if counts[s]
    ]
    first = checklist[0]
    if not counts[Severity.CRITICAL] and not counts[Severity.WARNING] and not _changes(first):
        return f"{', '.join(parts)}: nothing to fix; see the notes."
    return f"{', '.join(parts)}: start with {first.id} ({first.title})."


def _changes(f: Finding) -> bool:
    """A finding that recommends a change with a measured or predicted gain: never
    "nothing to fix" beside it, whatever its severity."""
    return bool(f.fix) and f.gain is not None and (f.gain.speedup or 1.0) >= 1.05


def _plural(n: int, word: str) -> str:
    # "critical" and "info" read as uncountable in a verdict; "warning" does not.
    return f"{n} {word}s" if n > 1 and word == "warning" else f"{n} {word}"
