"""Measured ratios between worker counts that the counts themselves can explain.

k DataLoader workers can load at most about k/j times what j workers loaded: each
worker takes a sample at a time, and the j workers' own time (on a CPU, waiting for
one, or blocked in I/O or sleep) is what one sample costs; more workers add hands, not
speed. num_workers=0 counts as one (the main process loads every sample itself), with
more slack: there it also collates, and runs torch's operations on threads of its own
that may compete for the CPUs, where each worker runs one. So a sleep-bound dataset
(100 ms a sample) can never load faster than workers / 100 ms. Workers measured doing
CPU work count up to the effective CPUs only: past them they share the same CPUs.

A worker may also take less time a sample than the main process did: there torch's
operations run on several threads that, on a busy machine, wait for each other and
for the CPUs (a JPEG decode at num_workers=0 took 9.7 ms of CPU a sample, 3.8 ms in a
worker). So the counts' own figures explain a ratio too: one sample costs a worker at
least its time blocked where fewer loaded (sleep and I/O do not shrink with more
workers) plus its CPU time measured at k (`Cost`), and k workers load at most k over
that. A ratio is unexplained only past both bounds.

A ratio past that bound is not a gain but a disturbed measurement: batches counted that
were made before the window, a round the machine stalled for the fewer workers. It is
said (naming both counts and the bound), read again, and never printed as a gain.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from starvecheck.core.paired import compare

# Above k/j: the spread a quiet machine leaves between two rounds' figures.
SLACK = 0.25
# Against num_workers=0: the main process also collates and may run torch's operations
# on several threads competing with each other, which workers (one thread each) do not.
SLACK_FROM_MAIN = 1.0


def most(k: int, j: int, cpus: float | None = None) -> float:
    """The largest ratio of k workers' samples/s over j workers' that their counts
    explain (k > j; 0 workers count as one, the main process); `cpus`: the effective
    CPUs, where k workers were measured doing CPU work."""
    slack = SLACK_FROM_MAIN if j == 0 else SLACK
    hands = min(k, max(cpus, j, 1.0)) if cpus else k
    return max(hands, 1) / max(j, 1) * (1.0 + slack)


@dataclass(frozen=True)
class Cost:
    """One sample's time at a worker count, ms: on a CPU (at 0 the main process's, all
    its threads; else the workers' together) and blocked, neither on a CPU nor waiting
    for one (I/O, sleep; at 0 the main process's wall time less its CPU and run-queue
    time). None where it could not be read."""

    cpu_ms: float | None
    blocked_ms: float | None


def by_cost(k: int, j: int, rate_j: float, costs: Mapping[int, Cost]) -> float | None:
    """The largest ratio of k workers' samples/s over j's (`rate_j`) that one sample's
    measured time explains: k workers over (j's blocked time + k's CPU time) a
    sample; None where the figures are missing or add up to nothing."""
    at_j, at_k = costs.get(j), costs.get(k)
    if at_j is None or at_k is None or at_j.blocked_ms is None or at_k.cpu_ms is None:
        return None
    least_ms = at_j.blocked_ms + at_k.cpu_ms
    if least_ms <= 0 or rate_j <= 0:
        return None
    return k / (least_ms / 1e3) * (1.0 + SLACK) / rate_j


@dataclass(frozen=True)
class Unexplained:
    """k workers measured `ratio` times j workers' samples/s, past `bound`."""

    workers: int
    against: int
    ratio: float
    bound: float
    sample_ms: float | None = None  # one sample's time at j: a worker's (or the main's)

    def describe(self) -> str:
        per = (
            f" (at num_workers={self.against} a sample took {self.sample_ms:,.1f} ms of "
            f"{'the main process' if self.against == 0 else 'a worker'})"
            if self.sample_ms
            else ""
        )
        return (
            f"num_workers={self.workers} measured {self.ratio:,.2f}x the samples/s of "
            f"num_workers={self.against}{per}, where {self.workers} "
            f"worker{'s' if self.workers > 1 else ''} can load at most about "
            f"{self.bound:.2f}x what "
            + (f"{self.against} loaded" if self.against else "the main process alone loaded")
            + " (by their counts and one sample's measured time)"
        )


def unexplained(
    rates: Mapping[int, Sequence[float]],
    cpus: float | None = None,
    cpu_work: Mapping[int, bool | None] | None = None,
    costs: Mapping[int, Cost] | None = None,
) -> list[Unexplained]:
    """Every pair of worker counts (more over fewer) whose ratio, round by round (the
    median, core/paired.py), is past what the counts explain; `rates`: samples/s a round
    by worker count; `cpu_work`: by count, whether its workers were measured doing CPU
    work (then they count up to `cpus`, the effective CPUs); `costs`: one sample's
    measured time by count, which explains a ratio past the counts' (`by_cost`)."""
    out = []
    counts = sorted(w for w, v in rates.items() if v)
    for i, j in enumerate(counts):
        for k in counts[i + 1 :]:
            c = compare(rates[k], rates[j])
            if c is None:
                continue
            busy = cpu_work is not None and cpu_work.get(k) is True
            bound = most(k, j, cpus if busy else None)
            known = [r for r in rates[j] if r > 0]
            timed = by_cost(k, j, statistics.median(known), costs or {}) if known else None
            bound = max(bound, timed or 0.0)
            if c.ratio > bound:
                per = _sample_ms(rates[j], j)
                out.append(Unexplained(k, j, c.ratio, bound, per))
    return out


def _sample_ms(rates: Sequence[float], workers: int) -> float | None:
    """One sample's time at `workers` (a worker's, or at 0 the main process's): the
    median samples/s shared among them."""
    known = [r for r in rates if r > 0]
    return max(workers, 1) / statistics.median(known) * 1e3 if known else None
