"""One configuration's wait for each batch split over the stages of loading
(loading/; core/schema/loading.py), as `watch` splits a loop's: which stage a
configuration's loading waits on, and where its workers spend their time.

The factory builds each configuration's DataLoader itself, so the timed collate_fn and
worker_init_fn stay on it for the configuration's reading (`Tap.hold`), and each batch
is matched with its worker by the iterator's own record. Every batch read goes through
the tap (a worker's records are counted in order); only those in the windows are summed
(`RunSplit.counting_from`), epoch restarts inside the windows included, as the windows
count them. The factory's loop asks for the next batch as soon as it has one: the whole
time a batch takes, not a step's leftover, is the wait it splits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starvecheck.core import clocks
from starvecheck.loading.split import STAGES
from starvecheck.loading.tap import Startup, Tap
from starvecheck.stages.loader.factory.made import Made


@dataclass
class RunSplit:
    """A configuration's split, summed over the batches of its windows: exposed and
    busy seconds by stage (split.STAGES' order), the batches' seconds made alone, and
    each epoch's worker start-up (loading/tap.Sink)."""

    exposed: list[float] = field(default_factory=lambda: [0.0] * len(STAGES))
    busy: list[float] = field(default_factory=lambda: [0.0] * len(STAGES))
    solo: float = 0.0
    batches: int = 0
    startups: list[Startup] = field(default_factory=list)
    counting_from: int | None = None  # the first batch (a running count) in a window
    when: Made = field(default_factory=Made)  # when each batch was made (made.py)

    def made(self, worker: int, done: float, work_s: float) -> None:
        self.when.add(worker, done, work_s)

    def put(self, step: int, exposed: list[float], busy: list[float], solo: float) -> None:
        if self.counting_from is None or step < self.counting_from:
            return
        self.exposed = [a + b for a, b in zip(self.exposed, exposed, strict=True)]
        self.busy = [a + b for a, b in zip(self.busy, busy, strict=True)]
        self.solo += solo
        self.batches += 1

    def merged(self, other: RunSplit) -> RunSplit:
        """Two readings of one configuration (its slices in rounds), added up."""
        return RunSplit(
            [a + b for a, b in zip(self.exposed, other.exposed, strict=True)],
            [a + b for a, b in zip(self.busy, other.busy, strict=True)],
            self.solo + other.solo,
            self.batches + other.batches,
            self.startups + other.startups,
        )


class Split:
    """The tap of one configuration's reading, and what it found."""

    def __init__(self, loader: Any) -> None:
        self.run = RunSplit()
        self.tap = Tap.of(loader, self.run)
        self.fetched = 0  # batches read so far, warm-up included: the tap's steps
        if self.tap is not None:
            self.tap.hold(None)

    def epoch(self) -> None:
        """An epoch begins (its iterator is made next)."""
        if self.tap is not None:
            self.tap.new_pass(clocks.perf_counter())

    def windows_begin(self) -> None:
        self.run.counting_from = self.fetched

    def before(self, iterator: Any) -> tuple[float, float, float]:
        if self.tap is not None:
            self.tap.before(iterator)
        return clocks.perf_counter(), clocks.thread_time(), clocks.process_time()

    def after(self, asked: tuple[float, float, float]) -> None:
        if self.tap is not None:
            self.tap.after(self.fetched, asked[0], clocks.perf_counter(), asked[1], asked[2])
        self.fetched += 1

    def epoch_over(self) -> None:
        """The epoch ended: its batches split, its workers' start-up kept."""
        if self.tap is None:
            return
        self.tap.finish()
        if (startup := self.tap.startup()) is not None:
            self.run.startups.append(startup)

    def release(self) -> None:
        if self.tap is not None:
            self.tap.release()
