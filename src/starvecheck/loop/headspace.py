"""Headspace: the step with no data wait at all, measured (SPDL's word).

With `watch(loader, headspace=N)`, the loop's first steps after the warm-up keep their
batches (KEEP of them, references only); at step AT the watch hands the loop those
batches again, in turn, for N steps, without asking the loader for anything. Those
steps train on batches already seen: say so to whoever reads the run. They are timed
apart (never in the loop's own figures): their time a step is the floor the loop's
step reaches when data is never waited for, and the gain of fixing the data path is
the loop's step over that floor, measured rather than modelled.

On a GPU the steps only queue work, so where CUDA is in use the replay is timed from
one `torch.cuda.synchronize()` before it to one after it (two in the whole run), and
its figure is the whole replay over N; on a CPU each replayed step is timed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

AT = 5  # steps before the replay: the first (a warm-up) and the batches kept
KEEP = 4
MAX_STEPS = 10_000


def steps(n: Any) -> int:
    """`headspace=` checked: a whole number of steps, 0 for none."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_STEPS:
        raise ValueError(f"headspace must be a number of steps from 0 to {MAX_STEPS}, not {n!r}")
    return n


@dataclass
class Replay:
    n: int
    kept: list[Any] = field(default_factory=list)
    done: bool = False

    def keep(self, item: Any) -> None:
        """A batch the loop received: kept while the replay has not run and wants more."""
        if self.n and not self.done and len(self.kept) < KEEP:
            self.kept.append(item)

    def due(self, steps_done: int) -> bool:
        return bool(self.n) and not self.done and steps_done >= AT and bool(self.kept)

    def run(
        self, out: list[float], clock: Callable[[], float], sync: Callable[[], None] | None
    ) -> Iterator[Any]:
        """Hand the kept batches to the loop for `n` steps; each step's seconds (or, with
        `sync`, the whole replay's over n, once) into `out`. The batches are let go."""
        self.done = True
        kept, self.kept = self.kept, []
        if sync is not None:
            sync()
        start = clock()
        for i in range(self.n):
            began = clock()
            yield kept[i % len(kept)]
            if sync is None:
                out.append(clock() - began)
        if sync is not None:
            sync()
            out.extend([(clock() - start) / self.n] * self.n)
