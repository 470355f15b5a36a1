"""`loader --factory` never passes what it could not read to steady state (principle
11): where a configuration's reading was cut short of a whole window or of the batches
its rate needs (a dataset too slow for the --budget), the verdict that the settings are
as good as any is not given; the finding says it could not tell, which configurations,
and the budget that would read them whole."""

from __future__ import annotations

from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Severity, StageResult
from starvecheck.core.schema.factory import SWEPT, Configuration
from starvecheck.core.schema.factory import Parameters as FactoryParameters

# A slice that read whole took about this many of its batch times (made.py, run.py): the
# budget that would read a cut one whole is its batch time times this, times the rounds.
WHOLE_BATCHES = 12


def withheld(loader: StageResult, changes: bool, counts: tuple[int, ...]) -> Finding | None:
    """What `loader.own-config` says instead of its verdict: `unread`'s finding where a
    configuration was cut short and either nothing is to change (no pass on such
    figures) or the change rests on a count cut short (`counts`: the current settings',
    the one chosen)."""
    cut = unread(loader)
    return cut if cut is not None and (not changes or cut_short(loader, counts)) else None


def cut_short(loader: StageResult, counts: tuple[int, ...]) -> bool:
    """One of these worker counts (the current settings', the one chosen) was cut short:
    no change can rest on it either."""
    p = loader.parameters.read(FactoryParameters)
    return any(
        c.partial_window and c.workers in counts and c.role in SWEPT for c in p.configurations
    )


def unread(loader: StageResult) -> Finding | None:
    """The finding where configurations were cut short; None where every one read whole."""
    p = loader.parameters.read(FactoryParameters)
    short = [c for c in p.configurations if c.partial_window]
    if not short:
        return None
    budget, rounds = p.budget_s, p.rounds or 1
    needed = max((_needed(c, rounds) for c in short), default=0.0)
    if budget is not None:
        # Cut short within `budget`: whatever its batches' pace says (a pace read past
        # each slice's start-up), less cannot read it whole. Twice it, at least.
        needed = max(needed, 2 * budget)
    now = f" (now {budget:g} s a configuration)" if budget is not None else ""
    said = ", ".join(c.config or f"num_workers={c.workers}" for c in short)
    return Finding(
        catalogue.LOADER_OWN_CONFIG,
        Severity.WARNING,
        f"Could not tell: {len(short)} configuration(s) could not be read to steady state "
        "in the --budget",
        evidence=(
            f"{said}: each read fewer batches than a steady figure needs (a dataset too slow "
            "for the budget: its figures are the first batches' pace, not the loop's); "
            "no configuration is recommended or called as good as any from them"
        ),
        recommendation=(
            f"Read it again with `--budget {max(needed, 1):,.0f}`{now}, about "
            f"{needed * len(p.configurations) / 60:,.1f} minutes in all at the pace measured."
        ),
        stage="loader",
    )


def _needed(c: Configuration, rounds: int) -> float:
    """The budget (seconds a configuration, over its rounds) that reads it whole, from
    its pace as read."""
    if not c.batches or not c.seconds:
        return 0.0
    per_batch = c.seconds / c.batches
    return per_batch * WHOLE_BATCHES * rounds
