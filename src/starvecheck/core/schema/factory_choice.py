"""What judging makes of loader --factory's figures (core/schema/factory.py): each
configuration as it compares them (`Point`: its record, and its samples/s a round,
counting unique samples only where workers repeat them), and the configuration it
recommends (`Choice`, carried by `Judged.choice`). Here, in core, so that the result
model can name them without importing advice/."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from starvecheck.core.criteria import cpu_work
from starvecheck.core.explained import Unexplained
from starvecheck.core.paired import Comparison
from starvecheck.core.schema.factory import Measured, Role, Settings


@dataclass(frozen=True)
class Point:
    figures: Measured
    rates: tuple[float, ...]  # samples/s, one figure a round, in round order
    unique: bool = False  # rates count unique samples (repeats were found)

    @property
    def rate(self) -> float:
        """The median over the rounds: the figure shown."""
        return statistics.median(self.rates)

    @property
    def role(self) -> Role:
        return self.figures.role

    @property
    def workers(self) -> int:
        return self.figures.workers

    @property
    def settings(self) -> Settings:
        return self.figures.settings

    @property
    def current(self) -> bool:
        """The user's own settings (the role says whether read for them)."""
        return self.figures.current

    def cpu_work(self) -> bool | None:
        """Its workers' measured time: on a CPU or waiting for one (CPU work), or blocked."""
        f = self.figures
        cpu, runq, blocked = (
            None if x is None else x.value
            for x in (f.cpu_ms_workers, f.runq_ms_workers, f.blocked_ms_workers)
        )
        if cpu is None or runq is None or blocked is None:
            return None
        return cpu_work(cpu, runq, cpu + runq + blocked)


@dataclass(frozen=True)
class Choice:
    current: Point
    chosen: Point  # the configuration recommended; the current one where no change is
    best: Point  # the best measured, whether or not it clears the margin
    against: Comparison | None  # best over current, round by round
    sweep: Mapping[int, Point]
    notes: tuple[str, ...]
    disturbed: tuple[Unexplained, ...] = ()  # ratios the counts cannot explain
    busy: float | None = None  # other processes' CPUs, where too busy to tell

    @property
    def changes(self) -> bool:
        return self.chosen is not self.current

    @property
    def gain(self) -> float | None:
        return round(self.against.ratio, 2) if self.against is not None and self.changes else None
