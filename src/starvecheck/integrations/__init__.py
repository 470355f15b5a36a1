"""Callbacks for the trainers people use: the same timing and report as
`starvecheck.watch`, from the trainer's own hooks. Three lines each:

    from starvecheck.integrations import TransformersCallback
    trainer = transformers.Trainer(..., callbacks=[TransformersCallback()])
    trainer.train()   # prints the step breakdown and the checklist at the end

    from starvecheck.integrations import LightningCallback
    trainer = lightning.Trainer(..., callbacks=[LightningCallback()])
    trainer.fit(model, loader)

A step begins when the trainer has its batch (transformers: `on_step_begin`;
Lightning: `on_train_batch_start`) and ends after the optimizer step (`on_step_end`,
`on_train_batch_end`); the data wait is the time from one step's end to the next
one's begin, less logging, evaluation and checkpoints the trainer reports there.
Options as `watch`'s: sync, every, file, show, barrier, barrier_timeout. Under
torch.distributed (DDP through accelerate or Lightning) rank 0 reports every rank.

Importing this package imports neither trainer: each class is made on first use.
The callbacks live with the loop's timer (starvecheck/loop/trainers/); this is their
public name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LightningCallback", "TransformersCallback"]


def __getattr__(name: str) -> Any:
    if name == "TransformersCallback":
        from starvecheck.loop.trainers.hf import TransformersCallback

        return TransformersCallback
    if name == "LightningCallback":
        from starvecheck.loop.trainers.pl import LightningCallback

        return LightningCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
