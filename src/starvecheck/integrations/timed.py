"""What both trainers' callbacks share: a Watch fed from hooks, and the options."""

from __future__ import annotations

from typing import Any, TextIO

from starvecheck.watcher import Watch

SINGLE = "_SingleProcessDataLoaderIter"  # the DataLoader iterator at num_workers=0
MULTI = "_MultiProcessingDataLoaderIter"


class Timed:
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
        self.watch.iterator = self.trainer

    def _workers(self, workers: object) -> None:
        """The trainer's DataLoader num_workers, where it says: the judgement reads
        whether loading runs in the training process."""
        if isinstance(workers, int):
            self.watch.num_workers = workers
            self.watch.iterator = SINGLE if workers == 0 else MULTI
