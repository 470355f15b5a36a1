"""Lightning's callback: the loop's data wait, per rank, as `watch` reports it.

Lightning calls `on_train_batch_start` with the batch in hand and
`on_train_batch_end` after the optimizer step; between the two hooks of successive
batches it fetches the next batch (its fetcher keeps one batch ahead), and runs
validation where due (`on_validation_start` .. `on_validation_end`, left out of the
wait). An epoch's first wait counts from `on_train_epoch_start`.

Subclasses `lightning.pytorch.Callback`, or `pytorch_lightning.Callback` where only
that package is installed, or `lightning` is there but does not import: pass it to the
Trainer of the same package.
"""

from __future__ import annotations

from typing import Any

from starvecheck.loop.trainers.hooks import Hooked, trainer_class

Callback = trainer_class(
    "LightningCallback",
    "Lightning",
    "lightning",
    ("lightning.pytorch", "Callback"),
    ("pytorch_lightning", "Callback"),  # the older package name
)


class LightningCallback(Hooked, Callback):  # type: ignore[misc]
    """`Trainer(..., callbacks=[LightningCallback()])`: prints the breakdown when
    training ends (and every `every` steps); `.watch` holds the figures."""

    trainer = "lightning.Trainer"

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        loader = getattr(trainer, "train_dataloader", None)
        workers = getattr(loader, "num_workers", None)
        self._workers(workers)
        # The stage split: Lightning's fetcher keeps one batch ahead where the loader
        # has no length (to know the last batch), none where it has one. It made the
        # first epoch's iterator before this hook: the split begins with the second
        # epoch (the first's workers carry no record), or never with persistent workers.
        self._loader(loader, ahead=0 if _sized(loader) else 1)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.watch.begin_pass()

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self.watch.begin_step(batch)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.watch.end_step()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.watch.resume_wait()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._ended()


def _sized(loader: object) -> bool:
    try:
        len(loader)  # type: ignore[arg-type]
    except Exception:  # no __len__, or an IterableDataset's DataLoader without one
        return False
    return True
