"""The configurations of a `loader --factory` run as judging reads them: one `Point`
per configuration (its figures, its samples/s one figure a round), and the DataLoader
line each one is. advice/factory.py chooses among them, advice/costs.py weighs what
they cost.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starvecheck.core.criteria import cpu_work
from starvecheck.core.metric import Caveat, Metric, one, select
from starvecheck.core.model import StageResult
from starvecheck.core.paired import spread
from starvecheck.core.schema.common import OTHERS_CPUS, SAMPLES_PER_S
from starvecheck.core.schema.factory import LAYOUT, WORKERS
from starvecheck.core.schema.factory import Parameters as FactoryParameters

KEYS = ("role", "workers", "prefetch_factor", "persistent_workers", "pin_memory")
# The roles of a configuration read again beside the count's variants, in their rounds:
# the count itself (`base`) and the current settings (`again`); never the sweep's own.
BESIDE = ("base", "again")


# Other processes keeping this many CPUs busy (median over the rounds), or one
# configuration's figure moving this much between rounds: the machine moved the figures.
BUSY_CPUS = 0.25
MOVED = 1.25
# Repeats within an epoch this much above the same pipeline's with the fewest workers:
# the workers deliver the same samples, and rates count unique samples only.
REPEATS_MARGIN = 0.02


@dataclass(frozen=True)
class Point:
    labels: Mapping[str, Any]
    rates: tuple[float, ...]  # samples/s, one figure a round, in round order
    metrics: tuple[Metric, ...]
    unique: bool = False  # rates count unique samples (repeats were found)

    @property
    def rate(self) -> float:
        """The median over the rounds: the figure shown."""
        return statistics.median(self.rates)

    def get(self, quantity: str, **more: Any) -> float | None:
        m = one(self.metrics, quantity=quantity, **more)
        return None if m is None else m.value

    @property
    def workers(self) -> int:
        return int(self.labels.get("workers", 0))

    @property
    def role(self) -> str:
        return str(self.labels.get("role", ""))

    def cpu_work(self) -> bool | None:
        """Its workers' measured time: on a CPU or waiting for one (CPU work), or blocked."""
        cpu = self.get("cpu_ms_per_sample", process=WORKERS)
        runq = self.get("runq_ms_per_sample", process=WORKERS)
        blocked = self.get("blocked_ms_per_sample", process=WORKERS)
        if cpu is None or runq is None or blocked is None:
            return None
        return cpu_work(cpu, runq, cpu + runq + blocked)

    def line(self, batch_size: Any) -> str:
        """The DataLoader line, exactly the `fix`: every setting it names."""
        fix = fix_of(self)
        parts = [f"batch_size={batch_size}"] + [f"{k}={v}" for k, v in fix.items()]
        return f"`DataLoader(dataset, {', '.join(parts)}, ...)`"


def points(loader: StageResult) -> list[Point]:
    """Every configuration measured. Where workers repeat samples (repeats_grow), every
    configuration's samples/s counts unique samples only: delivering the same sample
    twice is no faster."""
    out = []
    for m in select(loader.metrics, quantity=SAMPLES_PER_S, layout=LAYOUT):
        rates = m.values or ((m.value,) if m.value is not None else ())
        if not rates:
            continue
        where = {k: m.labels[k] for k in KEYS if k in m.labels}
        out.append(
            Point(m.labels, tuple(rates), tuple(select(loader.metrics, layout=LAYOUT, **where)))
        )
    if loader.parameters.read(FactoryParameters).iterable and repeats_grow(out):
        out = [
            Point(p.labels, tuple(r * (1.0 - (p.get("repeat_share") or 0.0)) for r in p.rates),
                  p.metrics, unique=True)
            for p in out
        ]  # fmt: skip
    return out


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
        if (s := p.get("repeat_share")) is not None
        and p.workers > fewest
        and s - share > REPEATS_MARGIN
    ]


def base_repeats(found: list[Point]) -> tuple[int, float] | None:
    """(workers, repeat share) of the configuration with the fewest workers."""
    shares = [(p.workers, s) for p in found if (s := p.get("repeat_share")) is not None]
    return min(shares) if shares else None


def describe(p: Point) -> str:
    return ", ".join(f"{k}={v}" for k, v in fix_of(p).items() if k != "pin_memory" or v)


def fix_of(p: Point) -> dict[str, Any]:
    """The settings of `p` that a DataLoader line names: num_workers, and where workers
    run, prefetch_factor and persistent_workers where they differ from torch's
    defaults; pin_memory where it is on, or where it is off as the measured variant
    of a pinned loader."""
    fix: dict[str, Any] = {"num_workers": p.workers}
    if p.workers:
        if int(p.labels.get("prefetch_factor") or 2) != 2:
            fix["prefetch_factor"] = int(p.labels.get("prefetch_factor") or 2)
        if p.labels.get("persistent_workers"):
            fix["persistent_workers"] = True
    if p.labels.get("pin_memory"):
        fix["pin_memory"] = True
    elif p.role == "pin":  # pinning measured slower than pageable memory here
        fix["pin_memory"] = False
    return fix


def moved_caveat(found: list[Point], loader: StageResult) -> Caveat | None:
    """One line where other work on the machine moved the figures, saying how much."""
    others = [v for p in found for m in select(p.metrics, quantity=OTHERS_CPUS) for v in m.values]
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
