"""What both trainers' callbacks share: a Watch fed from the trainer's hooks, and the
options. Each callback maps its trainer's hooks onto the timer's two lifecycles: a pass
(`begin_pass()` at an epoch's start, `end_pass()` when training ends) and a step
(`begin_step()` with the batch in hand, `end_step()` after the optimizer step,
`resume_wait()` after other work between two steps)."""

from __future__ import annotations

from typing import Any, TextIO

from starvecheck.loop.timer import Watch

SINGLE = "_SingleProcessDataLoaderIter"  # the DataLoader iterator at num_workers=0
MULTI = "_MultiProcessingDataLoaderIter"


class Hooked:
    """Holds `.watch`; options as `starvecheck.watch`'s."""

    trainer = "a trainer"  # what the report names as the loop's iterator

    def __init__(
        self,
        *,
        sync: bool = False,
        every: int | None = None,
        file: TextIO | None = None,
        show: bool = True,
        barrier: bool = False,
    ) -> None:
        self.watch: Watch[Any] = Watch(
            (), sync=sync, every=every, file=file, show=show, barrier=barrier
        )
        self.watch.times.iterator = self.trainer

    def _workers(self, workers: object) -> None:
        """The trainer's DataLoader num_workers, where it says: the judgement reads
        whether loading runs in the training process."""
        if isinstance(workers, int):
            self.watch.times.num_workers = workers
            self.watch.times.iterator = SINGLE if workers == 0 else MULTI
