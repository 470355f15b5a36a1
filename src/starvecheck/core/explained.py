"""Measured ratios between worker counts that the counts themselves can explain.

k DataLoader workers can load at most about k/j times what j workers loaded: each
worker takes a sample at a time, and the j workers' own time (on a CPU, waiting for
one, or blocked in I/O or sleep) is what one sample costs; more workers add hands, not
speed. num_workers=0 counts as one (the main process loads every sample itself), with
more slack: there it also collates, and runs torch's operations on threads of its own
that may compete for the CPUs, where each worker runs one. So a sleep-bound dataset
(100 ms a sample) can never load faster than workers / 100 ms. Workers measured doing
CPU work count up to the effective CPUs only: past them they share the same CPUs.

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
            f"num_workers={self.against}{per}, where {max(self.workers, 1)} "
            f"worker{'s' if self.workers > 1 else ''} can load at most about "
            f"{self.bound:.2f}x what "
            + (f"{self.against} loaded" if self.against else "the main process alone loaded")
        )


def unexplained(
    rates: Mapping[int, Sequence[float]],
    cpus: float | None = None,
    cpu_work: Mapping[int, bool | None] | None = None,
) -> list[Unexplained]:
    """Every pair of worker counts (more over fewer) whose ratio, round by round (the
    median, core/paired.py), is past what the counts explain; `rates`: samples/s a round
    by worker count; `cpu_work`: by count, whether its workers were measured doing CPU
    work (then they count up to `cpus`, the effective CPUs)."""
    out = []
    counts = sorted(w for w, v in rates.items() if v)
    for i, j in enumerate(counts):
        for k in counts[i + 1 :]:
            c = compare(rates[k], rates[j])
            if c is None:
                continue
            busy = cpu_work is not None and cpu_work.get(k) is True
            bound = most(k, j, cpus if busy else None)
            if c.ratio > bound:
                per = _sample_ms(rates[j], j)
                out.append(Unexplained(k, j, c.ratio, bound, per))
    return out


def _sample_ms(rates: Sequence[float], workers: int) -> float | None:
    """One sample's time at `workers` (a worker's, or at 0 the main process's): the
    median samples/s shared among them."""
    known = [r for r in rates if r > 0]
    return max(workers, 1) / statistics.median(known) * 1e3 if known else None
