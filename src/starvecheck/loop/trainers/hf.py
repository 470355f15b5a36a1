"""`transformers.Trainer`'s callback: the loop's data wait, per rank, as `watch` reports it.

transformers' training loop fetches a step's batches (all of a gradient-accumulation
window), then calls `on_step_begin`, runs the forward and backward passes and the
optimizer step, calls `on_step_end`, and then logs, evaluates and saves where due
(`on_log`, `on_evaluate`, `on_save` fire as each ends). So the time from a step's end
(or the last of those) to the next `on_step_begin` is the fetch of the next batches:
the data wait. An epoch's first wait counts from `on_epoch_begin` (the DataLoader's
workers start then).
"""

from __future__ import annotations

from typing import Any

from starvecheck.loop.trainers.hooks import Hooked, trainer_class

TrainerCallback = trainer_class(
    "TransformersCallback",
    "transformers",
    "transformers",
    ("transformers", "TrainerCallback"),
)


class TransformersCallback(Hooked, TrainerCallback):  # type: ignore[misc]
    """`Trainer(..., callbacks=[TransformersCallback()])`: prints the breakdown when
    training ends (and every `every` steps); `.watch` holds the figures
    (`.watch.report()`, `.watch.result()`)."""

    trainer = "transformers.Trainer"

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The DataLoader's own count (accelerate's wraps it: `base_dataloader`), where
        # the Trainer gives it: a get_train_dataloader() of the user's own need not
        # follow args.dataloader_num_workers.
        loader = kwargs.get("train_dataloader")
        inner = getattr(loader, "__dict__", {}).get("base_dataloader", loader)
        workers = getattr(inner, "num_workers", None)
        if not isinstance(workers, int):
            workers = getattr(args, "dataloader_num_workers", None)
        self._workers(workers)
        # The stage split: accelerate's DataLoaderShard is a DataLoader whose iterator
        # keeps one batch ahead. With gradient accumulation a step's wait fetches
        # several batches and a micro-step's none: the waits are not split.
        if getattr(args, "gradient_accumulation_steps", 1) == 1:
            self._loader(kwargs.get("train_dataloader"), ahead=1)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.watch.begin_pass()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.watch.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.watch.end_step()

    # Work between steps that is not the data: the wait starts counting after it.
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.watch.resume_wait()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.watch.resume_wait()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.watch.resume_wait()

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.watch.resume_wait()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._ended()
