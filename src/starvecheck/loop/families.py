"""A watched loop's figures as Prometheus metric families, made when Prometheus scrapes.

Nothing is done per step: the timer appends to its arrays as it always does
(loop/times.py), and a scrape reads the steps completed since the last one, adds them
to running totals and histogram buckets, and yields the families (prometheus_client's
custom-collector interface). So the loop pays nothing between scrapes, and a scrape
costs the steps it has not yet counted.

The seconds counters leave out the run's first step, as watch's own figures do (worker
start-up, the first prefetch): it is in the time-to-first-batch histogram instead. So
`starvecheck_data_wait_seconds_total / starvecheck_step_seconds_total` is watch's
data-wait share, and its rate over a window the share in that window. The families
and their labels are listed in docs/fleet.md.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starvecheck.loading.split import STAGES
from starvecheck.loop.times import LoopTimes

# Per-step data wait: 1 ms .. 10 s (a wait under 1 ms is a loader keeping ahead).
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Time to a pass's first batch (workers starting, files opening): 10 ms .. 10 minutes.
FIRST_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
PREFIX = "starvecheck_"


@dataclass
class Buckets:
    """A histogram's counts per bucket (not cumulative) and its sum."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1  # le: seconds <= bound
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip([*map(_le, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))


@dataclass
class Tally:
    """Running totals of the steps counted so far; `update` adds those completed since."""

    counted: int = 1  # steps counted: the first is the run's warm-up, left out
    batches: int = 0
    samples: int = 0
    base_samples: int = 0
    base: int = 0  # batches of the loops counted before this one (loop/exporter.follow)
    wait_s: float = 0.0
    step_s: float = 0.0
    rank_wait_s: float = 0.0
    gpu_counted: int = 0
    gpu_idle_s: float = 0.0
    gpu_period_s: float = 0.0
    waits: Buckets = field(default_factory=lambda: Buckets(WAIT_BUCKETS))
    first: Buckets = field(default_factory=lambda: Buckets(FIRST_BUCKETS))
    workers: dict[int, Buckets] = field(default_factory=dict)
    pass_starts: list[int] = field(default_factory=list)  # each pass's first step
    # The wait by stage of loading (loop/splits.py), seconds, in split.STAGES' order, of
    # the steps counted so far; a step's split comes once its worker's next batch is in
    # (at most a step a worker late), so they are counted that far behind.
    exposed_s: list[float] = field(default_factory=lambda: [0.0] * len(STAGES))
    exposed_counted: int = 1
    busy_s: list[float] = field(default_factory=lambda: [0.0] * len(STAGES))
    busy_base: list[float] = field(default_factory=lambda: [0.0] * len(STAGES))
    firsts_seen: int = 0  # of pass_starts, those whose first batch is counted
    workers_seen: int = 0  # of pass_starts, those whose workers' first batches are

    def update(self, t: LoopTimes) -> None:
        n = len(t.computes)  # completed steps; waits has this many, or one more
        self.batches = self.base + n + t.offset
        if t.batch_samples:
            self.samples = self.base_samples + (n + t.offset) * t.batch_samples
        start = self.counted
        if n > start:
            waits, computes = t.waits[start:n], t.computes[start:n]
            ranks = t.rank_waits[start:n] if len(t.rank_waits) >= n else ()
            wait, rank_wait = sum(waits), sum(ranks)
            self.wait_s += wait
            self.rank_wait_s += rank_wait
            self.step_s += wait + sum(computes) + rank_wait
            for w in waits:
                self.waits.observe(w)
            self.counted = n
        m = len(t.gpu_idle)
        if m > self.gpu_counted and len(t.gpu_period) >= m:
            self.gpu_idle_s += sum(t.gpu_idle[self.gpu_counted : m]) / 1e3
            self.gpu_period_s += sum(t.gpu_period[self.gpu_counted : m]) / 1e3
            self.gpu_counted = m
        self._firsts(t)
        self._stages(t, n)

    def _stages(self, t: LoopTimes, n: int) -> None:
        """The split's steps settled since the last scrape, added up by stage; the busy
        seconds are the split's own running sums."""
        split = t.split
        limit = n - (t.num_workers or 0) - 1
        arrays = [split.exposed[s] for s in STAGES]
        limit = min(limit, len(arrays[0]))
        for i in range(self.exposed_counted, limit):
            row = [a[i] for a in arrays]
            if not math.isnan(row[0]):
                self.exposed_s = [x + y for x, y in zip(self.exposed_s, row, strict=True)]
        self.exposed_counted = max(self.exposed_counted, limit)
        self.busy_s = [b + x for b, x in zip(self.busy_base, split.busy, strict=True)]

    def next_loop(self) -> Tally:
        """The tally a new watch on the same exporter goes on with: the totals kept (a
        counter never goes down), the new loop's steps counted from its own start."""
        return Tally(
            batches=self.batches,
            base=self.batches,
            samples=self.samples,
            base_samples=self.samples,
            wait_s=self.wait_s,
            step_s=self.step_s,
            rank_wait_s=self.rank_wait_s,
            gpu_idle_s=self.gpu_idle_s,
            gpu_period_s=self.gpu_period_s,
            waits=self.waits,
            first=self.first,
            workers=self.workers,
            exposed_s=self.exposed_s,
            busy_s=self.busy_s,
            busy_base=self.busy_s,
        )

    def _firsts(self, t: LoopTimes) -> None:
        """Each pass's time to its first batch, and with workers each worker's: the
        DataLoader deals batches to its workers in turn, so the pass's k-th batch is
        worker k's first, arriving the waits and steps before it after the start."""
        got = len(t.waits)
        while self.firsts_seen < len(self.pass_starts):
            s = self.pass_starts[self.firsts_seen]
            if s >= got:
                break
            self.first.observe(t.waits[s])
            self.firsts_seen += 1
        workers = t.num_workers or 0
        while workers > 0 and self.workers_seen < len(self.pass_starts):
            s = self.pass_starts[self.workers_seen]
            if s + workers > len(t.computes):
                break
            arrived = 0.0
            for k in range(workers):
                arrived += t.waits[s + k]
                self.workers.setdefault(k, Buckets(FIRST_BUCKETS)).observe(arrived)
                arrived += t.computes[s + k]
            self.workers_seen += 1


@dataclass(frozen=True)
class Advice:
    """The live recommendation (loop/live.py): None where there is none to state."""

    num_workers: int | None = None
    recommended: int | None = None
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    link: str | None = None  # the weakest link: "data loading" or "training step"


# Each family's help text, by its name after the prefix.
HELP = {
    "batches": "Batches the loop received (every step completed).",
    "samples": "Samples received: batches times the first batch's leading size.",
    "data_wait_seconds": "Seconds the loop waited for data (the run's first step left out).",
    "step_seconds": "Seconds of whole steps: data wait, compute, barrier (first step out).",
    "rank_wait_seconds": "Seconds at the barrier waiting for the other ranks (barrier=True).",
    "gpu_idle_seconds": "Seconds the GPU sat idle waiting for data, on the device's clock.",
    "gpu_period_seconds": "Seconds of the same steps on the device's clock.",
    "data_wait_step_seconds": "Each step's data wait (the run's first step left out).",
    "first_batch_seconds": "Each pass's time to its first batch (an epoch's start).",
    "worker_first_batch_seconds": "Each pass's time to each DataLoader worker's first batch.",
    "data_wait_ratio": "The run's data-wait share so far, as watch reports it.",
    "num_workers": "The DataLoader's num_workers now.",
    "recommended_num_workers": "num_workers the worker model recommends.",
    "predicted_speedup": "Predicted throughput with the recommended num_workers over now.",
    "predicted_speedup_low": "Low end of the predicted speed-up's interval.",
    "predicted_speedup_high": "High end of the predicted speed-up's interval.",
    "weakest_link": "1 for the link that bounds the loop now (data loading, training step).",
    "data_wait_exposed_seconds": (
        "Seconds of the data wait each stage of loading was on the critical path of "
        "(exposed: what prefetching did not hide); over the steps split, the stages add up "
        "to their data wait."
    ),
    "loading_busy_seconds": (
        "Seconds each stage of loading worked, wherever it ran (in the workers, hidden "
        "while they keep ahead)."
    ),
}


def families(tally: Tally, labels: Mapping[str, str], advice: Advice) -> Iterator[Any]:
    """The metric families, from the tally and the last advice (prometheus_client's)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    names, values = list(labels), list(labels.values())
    share = tally.wait_s / tally.step_s if tally.step_s > 0 else None
    counters = {
        "batches": tally.batches,
        "samples": tally.samples or None,
        "data_wait_seconds": tally.wait_s,
        "step_seconds": tally.step_s,
        "rank_wait_seconds": tally.rank_wait_s or None,
        "gpu_idle_seconds": tally.gpu_idle_s if tally.gpu_counted else None,
        "gpu_period_seconds": tally.gpu_period_s if tally.gpu_counted else None,
    }
    for name, value in counters.items():
        if value is not None:
            c = CounterMetricFamily(PREFIX + name, HELP[name], labels=names)
            c.add_metric(values, value)
            yield c
    yield from histograms(tally, names, values)
    yield from stages(tally, names, values)
    gauges = {
        "data_wait_ratio": share,
        "num_workers": advice.num_workers,
        "recommended_num_workers": advice.recommended,
        "predicted_speedup": advice.speedup,
        "predicted_speedup_low": advice.low,
        "predicted_speedup_high": advice.high,
    }
    for name, value in gauges.items():
        if value is not None:
            g = GaugeMetricFamily(PREFIX + name, HELP[name], labels=names)
            g.add_metric(values, value)
            yield g
    if advice.link is not None:
        name = "weakest_link"
        g = GaugeMetricFamily(PREFIX + name, HELP[name], labels=[*names, "link"])
        g.add_metric([*values, advice.link], 1.0)
        yield g


def stages(tally: Tally, names: list[str], values: list[str]) -> Iterator[Any]:
    """A counter a stage of loading, labelled `stage` (loop/splits.py): exposed and busy
    seconds, where the wait was split at all."""
    from prometheus_client.core import CounterMetricFamily

    for name, totals in (("data_wait_exposed_seconds", tally.exposed_s),
                         ("loading_busy_seconds", tally.busy_s)):  # fmt: skip
        if not any(totals):
            continue
        c = CounterMetricFamily(PREFIX + name, HELP[name], labels=[*names, "stage"])
        for stage, total in zip(STAGES, totals, strict=True):
            c.add_metric([*values, stage.value], total)
        yield c


def histograms(tally: Tally, names: list[str], values: list[str]) -> Iterator[Any]:
    from prometheus_client.core import HistogramMetricFamily

    for name, b in (("data_wait_step_seconds", tally.waits), ("first_batch_seconds", tally.first)):
        h = HistogramMetricFamily(PREFIX + name, HELP[name], labels=names)
        h.add_metric(values, b.cumulative(), b.total)
        yield h
    if tally.workers:
        name = "worker_first_batch_seconds"
        h = HistogramMetricFamily(PREFIX + name, HELP[name], labels=[*names, "worker"])
        for k, b in sorted(tally.workers.items()):
            h.add_metric([*values, str(k)], b.cumulative(), b.total)
        yield h
