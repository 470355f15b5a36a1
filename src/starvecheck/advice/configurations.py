"""The configurations of a `loader --factory` run as judging reads them: one `Point`
per configuration (its figures, its samples/s one figure a round), and the DataLoader
line each one is. advice/factory.py chooses among them, advice/costs.py weighs what
they cost.
"""

from __future__ import annotations

import statistics
from typing import Any

from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.paired import spread
from starvecheck.core.schema.factory import FactoryFigures, Role
from starvecheck.core.schema.factory import Parameters as FactoryParameters
from starvecheck.core.schema.factory_choice import Point
from starvecheck.core.schema.figure import value_of

__all__ = ["Point", "describe", "fix_of", "line", "moved_caveat", "points", "repeats_grow"]


# Other processes keeping this many CPUs busy (median over the rounds), or one
# configuration's figure moving this much between rounds: the machine moved the figures.
BUSY_CPUS = 0.25
MOVED = 1.25
# Repeats within an epoch this much above the same pipeline's with the fewest workers:
# the workers deliver the same samples, and rates count unique samples only.
REPEATS_MARGIN = 0.02


def line(p: Point, batch_size: Any) -> str:
    """The DataLoader line, exactly the `fix`: every setting it names."""
    fix = fix_of(p)
    parts = [f"batch_size={batch_size}"] + [f"{k}={v}" for k, v in fix.items()]
    return f"`DataLoader(dataset, {', '.join(parts)}, ...)`"


def points(loader: StageResult) -> list[Point]:
    """Every configuration measured (its record: `StageResult.records`). Where workers
    repeat samples (repeats_grow), every configuration's samples/s counts unique
    samples only: delivering the same sample twice is no faster."""
    out = []
    for c in loader.records(FactoryFigures).configurations:
        rate = c.samples_per_s
        rates = () if rate is None else rate.values or (() if rate.value is None else (rate.value,))
        if rates:
            out.append(Point(c, tuple(rates)))
    if loader.parameters.read(FactoryParameters).iterable and repeats_grow(out):
        out = [
            Point(p.figures, tuple(r * (1.0 - (_repeats(p) or 0.0)) for r in p.rates), unique=True)
            for p in out
        ]
    return out


def _repeats(p: Point) -> float | None:
    return value_of(p.figures.repeat_share)


def repeats_grow(found: list[Point]) -> list[tuple[Point, float]]:
    """(configuration, its repeat share) where its samples repeat within an epoch more
    than the same pipeline's with the fewest workers measured: the workers, not the
    dataset, repeat them. Empty where nothing was fingerprinted."""
    base = base_repeats(found)
    if base is None:
        return []
    fewest, share = base
    return [
        (p, s)
        for p in found
        if (s := _repeats(p)) is not None and p.workers > fewest and s - share > REPEATS_MARGIN
    ]


def base_repeats(found: list[Point]) -> tuple[int, float] | None:
    """(workers, repeat share) of the configuration with the fewest workers."""
    shares = [(p.workers, s) for p in found if (s := _repeats(p)) is not None]
    return min(shares) if shares else None


def describe(p: Point) -> str:
    return ", ".join(f"{k}={v}" for k, v in fix_of(p).items() if k != "pin_memory" or v)


def fix_of(p: Point) -> dict[str, Any]:
    """The settings of `p` that a DataLoader line names: num_workers, and where workers
    run, prefetch_factor and persistent_workers where they differ from torch's
    defaults; pin_memory where it is on, or where it is off as the measured variant
    of a pinned loader."""
    s = p.settings
    fix: dict[str, Any] = {"num_workers": p.workers}
    if p.workers:
        if (s.prefetch_factor or 2) != 2:
            fix["prefetch_factor"] = s.prefetch_factor or 2
        if s.persistent_workers:
            fix["persistent_workers"] = True
    if s.pin_memory:
        fix["pin_memory"] = True
    elif p.role == Role.PIN:  # pinning measured slower than pageable memory here
        fix["pin_memory"] = False
    return fix


def others_cpus(found: list[Point]) -> list[float]:
    """The CPUs other processes kept busy, every round of every configuration."""
    return [v for p in found if (o := p.figures.others_cpus) is not None for v in o.values]


def moved_caveat(found: list[Point], loader: StageResult) -> Caveat | None:
    """One line where other work on the machine moved the figures, saying how much."""
    others = others_cpus(found)
    busy = statistics.median(others) if others else None
    moves = [(p, s) for p in found if (s := spread(p.rates)) is not None]
    worst = max(moves, key=lambda kv: kv[1], default=None)
    if worst is None or ((busy is None or busy < BUSY_CPUS) and worst[1] < MOVED):
        return None
    p, most = worst
    text = ""
    if busy is not None and busy >= BUSY_CPUS:
        text = (
            f"other processes kept {busy:.1f} of the {float(loader.parameters.cpus):g} CPUs busy "
            f"(median over the rounds, up to {max(others):.1f}); "
        )
    text += (
        f"one configuration's samples/s moved up to {most:.2f}x between rounds "
        f"({describe(p)}); configurations were read side by side, round by round, and are "
        "compared by their ratio in each round, which such load moves far less"
    )
    return Caveat("machine.busy", "The machine moved the figures: " + text)
