"""What both trainers' callbacks share: a Watch fed from the trainer's hooks, and the
options. Each callback maps its trainer's hooks onto the timer's two lifecycles: a pass
(`begin_pass()` at an epoch's start, `end_pass()` when training ends) and a step
(`begin_step()` with the batch in hand, `end_step()` after the optimizer step,
`resume_wait()` after other work between two steps)."""

from __future__ import annotations

import importlib
from typing import Any

from starvecheck.loop.output import never_raising
from starvecheck.loop.timer import Watch

SINGLE = "_SingleProcessDataLoaderIter"  # the DataLoader iterator at num_workers=0
MULTI = "_MultiProcessingDataLoaderIter"


class Hooked:
    """Holds `.watch`; options as `starvecheck.watch`'s (loop/options.WatchOptions)."""

    trainer = "a trainer"  # what the report names as the loop's iterator

    def __init__(self, **options: Any) -> None:
        if "headspace" in options:  # steps replayed from memory: a loop we iterate only
            raise TypeError("headspace applies to starvecheck.watch(loader) only")
        self.watch: Watch[Any] = Watch((), **options)
        self.watch.times.iterator = self.trainer

    def _loader(self, loader: object, ahead: int = 1) -> None:
        """The trainer's DataLoader, for the stage split, where it is one (its fetcher
        keeps `ahead` batches ahead); given back as it was when training ends."""
        with never_raising(self.watch._warned, "time the DataLoader's stages"):
            self.watch.hold_loader(loader, ahead)

    def _ended(self) -> None:
        with never_raising(self.watch._warned, "put the DataLoader back"):
            self.watch.release_loader()
        self.watch.end_pass()

    def _workers(self, workers: object) -> None:
        """The trainer's DataLoader num_workers, where it says: the judgement reads
        whether loading runs in the training process."""
        if isinstance(workers, int):
            self.watch.times.num_workers = workers
            self.watch.times.iterator = SINGLE if workers == 0 else MULTI


def trainer_class(callback: str, needs: str, extra: str, *where: tuple[str, str]) -> Any:
    """The trainer's class from the first of `where` (module, name) that imports. Any
    error counts as not importing, not only ImportError: a broken installation raises
    whatever its own import raises (a RuntimeError from transformers' lazy modules, or
    from a package whose dependency changed under it). None that imports: an ImportError
    of one line, what failed and how to install, instead of the trainer's traceback."""
    failed = []
    for module, name in where:
        try:
            return getattr(importlib.import_module(module), name)
        except Exception as e:
            why = " ".join(str(e).split())
            why = why if len(why) <= 200 else why[:197] + "..."
            failed.append(f"import {module} failed ({type(e).__name__}: {why})")
    raise ImportError(
        f"{callback} needs {needs}: {'; '.join(failed)}; "
        f"install it with: pip install 'starvecheck[{extra}]'"
    )
