"""When a set of `loader --factory`'s rounds may stop (rounds.read_rounds' `settled`):
once more rounds could not change what judging makes of it (core/criteria.py), and,
for the worker counts, once the count called enough either clears the current
settings or cannot (a gain the rounds so far can neither clear nor rule out is read
on, up to the rounds planned)."""

from __future__ import annotations

import statistics

from starvecheck.core.criteria import cpu_work, knee_settled, paired_knee, variants_settled
from starvecheck.core.paired import compare
from starvecheck.core.schema.factory import BESIDE, SWEPT, Role
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.run import Run


def counts_settled(
    runs: list[tuple[str, Run]], now: Config | None = None, cpus: float = 0.0
) -> bool:
    """The worker counts read so far decide the count (criteria.knee_settled) and, with
    `now` (the current settings), whether it gains on them: a gain the rounds so far
    can neither clear nor rule out is read on (core/paired.Comparison.undecided)."""
    if not knee_settled({r.config.workers: r.samples_per_s for role, r in runs if role in SWEPT}):
        return False
    return not undecided_pair(runs, now, cpus)


def variants_settled_runs(runs: list[tuple[str, Run]]) -> bool:
    """Each variant's ratio to the count beside it, and the count's to the current
    settings read again, lies on one side of the margin (criteria.variants_settled)."""
    base = next((r for role, r in runs if role == Role.BASE), None)
    if base is None:
        return True
    others = [r.samples_per_s for role, r in runs if role not in BESIDE]
    again = next((r for role, r in runs if role == Role.AGAIN), None)
    if again is not None:
        others.append(again.samples_per_s)
    return variants_settled(others, base.samples_per_s)


def knee_run(runs: list[tuple[str, Run]], cpus: float) -> Run | None:
    """The count the sweep calls enough (the fewest within 5% of the best, round by
    round; past the CPUs only for workers measured blocked, as advice/ judges)."""
    swept = [r for role, r in runs if role == Role.WORKERS]
    if not swept:
        return None
    rates = {r.config.workers: r.samples_per_s for r in swept}
    at_best = max(swept, key=median_rate)
    worked = cpu_work(at_best.worker_cpu_s, at_best.worker_runq_s, at_best.worker_alive_s)
    best = paired_knee(rates, cpus if worked is not False else max(rates))
    return next((r for r in swept if r.config.workers == best), None)


def median_rate(run: Run) -> float:
    return statistics.median(run.samples_per_s) if run.samples_per_s else 0.0


def undecided_pair(
    runs: list[tuple[str, Run]], now: Config | None = None, cpus: float = 0.0
) -> set[Config]:
    """The count called enough and the current settings, where the gain of one over
    the other is undecided after the rounds read (core/paired.Comparison.undecided):
    more rounds of the two decide it (rounds.More); else none."""
    mine = next((r for role, r in runs if role in SWEPT and r.config == now), None)
    base = knee_run(runs, cpus) if mine is not None else None
    if mine is None or base is None or base is mine:
        return set()
    c = compare(base.samples_per_s, mine.samples_per_s)
    return {base.config, mine.config} if c is not None and c.undecided() else set()
