"""A configuration whose batches are too slow for windows in its budget, read by when
its batches were made (`loader --factory`; issue 57: right first time, in two minutes).

A window counts the batches delivered while it is open, so it must begin on a drained
prefetch queue and hold several batches a worker: about 3 x prefetch_factor + 2 batch
times (9 at the default prefetch of 2) before a first figure. On a dataset whose batches
take seconds (100 ms a sample, batch 16) that is over a minute a configuration, and a
budget cut shorter read every configuration at its first batch's pace: `--quick` once
passed such a pipeline at 10 samples/s for every worker count, where two workers truly
load it 2x.

The stage split's records say when each batch was made, in the worker that made it
(loading/stamps.py: collate's end, on the one clock): buffered batches carry their own
times, so no queue needs draining. Once every worker has made its first batch (its
start-up behind it), the batches made after the last of those firsts, over the time
they span, are the configuration's steady rate: each worker's batches one batch time
apart, whoever consumes them. `enough` is `INTERVALS` such batches a worker (at
num_workers=0, the training process's own). A reading is slow (`too_slow`) where the
windows would take longer than its slice of the budget at the pace of its first batch's
own work (the worker's time making it, start-up left out). The figure is one a slice,
as a window's is; epoch restarts are not in it (a run too slow for windows is not read
across an epoch's end: `epoch_start_s` still is, from the first batch of each epoch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

INTERVALS = 2  # batches a worker made after the last worker's first, before the rate


def too_slow(work_s: float, workers: int, prefetch: int | None, budget_s: float) -> bool:
    """Windows would take longer than `budget_s` at `work_s` a batch a worker."""
    w = max(1, workers)
    p = prefetch or 2
    drained = (1 + workers * p) + (workers * p + 1)  # the warm-up and the drain
    window = max(2, workers * (p + 2))
    return (drained + window) * work_s / w > budget_s


@dataclass
class Made:
    """When each batch was made, by worker (-1: the training process itself)."""

    by_worker: dict[int, list[float]] = field(default_factory=dict)
    first_work_s: float | None = None  # the first batch's own work (start-up left out)

    def add(self, worker: int, done: float, work_s: float) -> None:
        self.by_worker.setdefault(worker, []).append(done)
        if self.first_work_s is None and work_s > 0:
            self.first_work_s = work_s

    def enough(self, workers: int, intervals: int = INTERVALS) -> bool:
        """Every worker has made `intervals` batches past the last worker's first."""
        want = range(workers) if workers else (-1,)
        if any(len(self.by_worker.get(w, ())) < 1 for w in want):
            return False
        start = max(self.by_worker[w][0] for w in want)
        return all(sum(1 for t in self.by_worker[w] if t > start) >= intervals for w in want)

    def rate(self, workers: int) -> tuple[float, int, float] | None:
        """(batches a second, batches counted, seconds) over the batches made after
        the last worker's first; None where there are none."""
        want = range(workers) if workers else (-1,)
        if any(not self.by_worker.get(w) for w in want):
            return None
        start = max(self.by_worker[w][0] for w in want)
        after = sorted(t for w in want for t in self.by_worker[w] if t > start)
        if not after or after[-1] <= start:
            return None
        span = after[-1] - start
        return len(after) / span, len(after), span
