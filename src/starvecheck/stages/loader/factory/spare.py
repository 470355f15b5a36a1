"""What the first round of the worker counts changes in the rest: --quick's spare
worker count, and the counts read no more.

--quick's spare count: the quick sweep stops at the effective CPUs, where
CPU-bound loading stops gaining; loading that waits (a network read, a sleep) goes on
gaining past them, and the full sweep (up to twice the CPUs) finds it. So that --quick
names the count the full run would, its first round may add the full sweep's next
count, where that round says the workers wait rather than compute and the top count
read is still gaining on the one below it; the count is checked against the
machine's limits with the rest (fits.py), so it is read only where it fits.

A count the first round read far below the best (criteria.far_below) is settled as
slower: it is read no more, so that the rounds' seconds go to the counts that may be
enough (never the current configuration: every gain is read against it).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from starvecheck.core.criteria import cpu_work, far_below
from starvecheck.core.schema.factory import SWEPT, Role
from starvecheck.stages import options
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.rounds import Decided, Grow, More
from starvecheck.stages.loader.factory.run import Run
from starvecheck.stages.loader.factory.settled import undecided_pair

# The top count must have gained at least this part of what its extra workers could
# give over the count below it (2 workers over 1: 1.5x or more), else the count below
# is near the knee and a larger one could not be enough on its own.
STILL_GAINING = 0.5


def spare_count(effective_cpus: int, counts: tuple[int, ...]) -> int | None:
    """The full sweep's next count past the quick sweep's top; None where there is none."""
    top = max(counts, default=0)
    return next((w for w in options.default_workers(effective_cpus) if w > top), None)


def _rate(run: Run) -> float:
    return statistics.median(run.samples_per_s) if run.samples_per_s else 0.0


def wanted(swept: list[Run], spare: int) -> Config | None:
    """The spare count's configuration (the top count's other settings) where the first
    round asks for it: the top count is the fastest read, still gaining (STILL_GAINING)
    on the count below, and its workers measured blocked, not computing (a figure
    missing counts as computing: no spare)."""
    counted = [r for r in swept if r.config.workers]
    if len(counted) < 2:
        return None
    top = max(counted, key=lambda r: r.config.workers)
    below = max((r for r in counted if r is not top), key=lambda r: r.config.workers)
    if top.config.workers >= spare or max(swept, key=_rate) is not top or not _rate(below):
        return None
    could = top.config.workers / below.config.workers - 1.0
    if _rate(top) / _rate(below) - 1.0 < STILL_GAINING * could:
        return None
    if cpu_work(top.worker_cpu_s, top.worker_runq_s, top.worker_alive_s) is not False:
        return None
    c = top.config
    return Config(spare, c.prefetch_factor, c.persistent_workers, c.pin_memory, c.context)


@dataclass
class Tally:
    """The configurations read so far and to read in all, for the progress line: the
    first round's changes move the total."""

    total: int
    done: int = 0


def grows(spare: int | None, rounds: int, tally: Tally) -> Grow:
    """read_rounds' `grow`: the spare count where the first round asks for it."""

    def grow(runs: list[tuple[str, Run]]) -> list[tuple[str, Config]]:
        swept = [r for role, r in runs if role == Role.WORKERS]
        config = wanted(swept, spare) if spare is not None else None
        if config is None:
            return []
        tally.total += rounds
        return [(Role.WORKERS, config)]

    return grow


def decides(now: Config, rounds: int, tally: Tally) -> Decided:
    """read_rounds' `decided`: the counts the first round read far below the best,
    never the current configuration."""

    def decided(runs: list[tuple[str, Run]]) -> set[Config]:
        rates = {r.config.workers: r.samples_per_s for role, r in runs if role in SWEPT}
        slow = far_below(rates, now.workers)
        out = {r.config for role, r in runs if role in SWEPT and r.config.workers in slow}
        out.discard(now)
        tally.total -= len(out) * (rounds - 1)
        return out

    return decided


# Where the count called enough and the current settings still cannot be told apart
# after the planned rounds (a gain neither cleared nor ruled out), the two are read on
# in rounds of their own: at most this many more, in at most this many times --budget
# (full, quick: at the default budgets 30 s and 15 s, --quick within its 30 s and the
# full run within 2 minutes on the examples).
MORE_ROUNDS = {False: 6, True: 6}
MORE_BUDGETS = {False: 3.0, True: 5.0}


def reads_on(now: Config, cpus: float, tally: Tally, quick: bool, budget_s: float) -> More:
    """read_rounds' `more`: the count called enough and the current settings, while
    their gain is undecided (settled.undecided_pair), counted into the progress."""

    def undecided(runs: list[tuple[str, Run]]) -> set[Config]:
        found = undecided_pair(runs, now, cpus)
        tally.total = max(tally.total, tally.done + len(found))
        return found

    return More(undecided, MORE_ROUNDS[quick], MORE_BUDGETS[quick] * budget_s)
