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
from starvecheck.core.metric import Metric, one, select
from starvecheck.core.model import StageResult

LAYOUT = "own"
KEYS = ("role", "workers", "prefetch_factor", "persistent_workers", "pin_memory")


@dataclass(frozen=True)
class Point:
    labels: Mapping[str, Any]
    rates: tuple[float, ...]  # samples/s, one figure a round, in round order
    metrics: tuple[Metric, ...]

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
        cpu = self.get("cpu_ms_per_sample", process="workers")
        runq = self.get("runq_ms_per_sample", process="workers")
        blocked = self.get("blocked_ms_per_sample", process="workers")
        if cpu is None or runq is None or blocked is None:
            return None
        return cpu_work(cpu, runq, cpu + runq + blocked)

    def line(self, batch_size: Any) -> str:
        """The DataLoader line, exactly the `fix`: every setting it names."""
        fix = fix_of(self)
        parts = [f"batch_size={batch_size}"] + [f"{k}={v}" for k, v in fix.items()]
        return f"`DataLoader(dataset, {', '.join(parts)}, ...)`"


def points(loader: StageResult) -> list[Point]:
    out = []
    for m in select(loader.metrics, quantity="samples_per_s", layout=LAYOUT):
        rates = m.values or ((m.value,) if m.value is not None else ())
        if not rates:
            continue
        where = {k: m.labels[k] for k in KEYS if k in m.labels}
        out.append(
            Point(m.labels, tuple(rates), tuple(select(loader.metrics, layout=LAYOUT, **where)))
        )
    return out


def describe(p: Point) -> str:
    return ", ".join(f"{k}={v}" for k, v in fix_of(p).items() if k != "pin_memory" or v)


def fix_of(p: Point) -> dict[str, Any]:
    """The settings of `p` that a DataLoader line names: num_workers, and where workers
    run, prefetch_factor and persistent_workers where they differ from torch's
    defaults; pin_memory where it is on."""
    fix: dict[str, Any] = {"num_workers": p.workers}
    if p.workers:
        if int(p.labels.get("prefetch_factor") or 2) != 2:
            fix["prefetch_factor"] = int(p.labels.get("prefetch_factor") or 2)
        if p.labels.get("persistent_workers"):
            fix["persistent_workers"] = True
    if p.labels.get("pin_memory"):
        fix["pin_memory"] = True
    return fix
