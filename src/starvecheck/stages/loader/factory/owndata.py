"""The user's dataset and batches, as `loader --factory` measures them: each sample's
exception named with its index (`Named`, `SampleFailed`), starvecheck's worker set-up
before the user's (`ChainedInit`), a batch of any shape counted in samples and bytes
(`batch_figures`), moved to the GPU (`to_device`), and a worker's exception as one line
(`worker_error`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

from starvecheck.stages.dataloader.deaths import named
from starvecheck.stages.dataloader.workers import die_with_parent, worker_init
from starvecheck.stages.loader.factory.load import one_line

# A batch's structure is walked this deep and this wide to count its samples and bytes.
_WALK_DEPTH = 6
_WALK_ITEMS = 10_000


def batch_figures(batch: Any, batch_size: int | None = None) -> tuple[int, int]:
    """(samples, bytes) of a collated batch of any shape: tensors, numpy arrays, and
    lists, tuples and dicts of them. Samples: the leading size its top-level fields
    agree on (a tensor's first dimension, a list's length), else the length of a list
    of samples, else `batch_size`; bytes: every tensor's and array's, and strings'.
    A batch of the user's own class whose __len__ or __iter__ raises counts as
    `batch_size` samples (or 1) and the bytes read before it raised."""
    try:
        samples = _samples(batch, batch_size)
    except Exception:
        samples = batch_size or 1
    return samples, _bytes(batch)


def _leading(item: Any) -> int | None:
    if _nbytes(item) is not None:
        try:  # a nested tensor has no shape; a custom object's may be anything
            shape = tuple(getattr(item, "shape", ()))
            return int(shape[0]) if shape else None
        except Exception:
            return None
    if isinstance(item, list):
        return len(item)
    return None


def _samples(batch: Any, batch_size: int | None) -> int:
    if _nbytes(batch) is not None:
        return _leading(batch) or 1
    fields = list(batch.values()) if isinstance(batch, dict) else batch
    if not isinstance(fields, list | tuple):
        return batch_size or 1
    sizes = [n for n in map(_leading, fields[:64]) if n is not None]
    if batch_size is not None:
        # The batch size asked for settles it: a field that long, else (the last, short
        # batch) the fields' common leading size, else a list of that many samples.
        if batch_size in sizes:
            return batch_size
        if sizes and len(set(sizes)) == 1 and sizes[0] < batch_size:
            return sizes[0]
        if isinstance(batch, list) and 0 < len(batch) <= batch_size:
            return len(batch)
    if sizes and len(set(sizes)) == 1:
        return sizes[0]
    if isinstance(batch, list) and batch:
        return len(batch)
    return max(set(sizes), key=sizes.count) if sizes else batch_size or 1


def _bytes(batch: Any) -> int:
    """Every tensor's and array's bytes, and strings', walked bounded; a container of
    the user's own whose __iter__ raises ends the walk with what was counted."""
    total = 0
    seen = 0
    stack: list[tuple[Any, int]] = [(batch, 0)]
    with contextlib.suppress(Exception):
        while stack and seen < _WALK_ITEMS:
            item, depth = stack.pop()
            seen += 1
            nbytes = _nbytes(item)
            if nbytes is not None:
                total += nbytes
            elif isinstance(item, str | bytes):
                total += len(item)
            elif depth < _WALK_DEPTH and isinstance(item, dict):
                stack.extend((v, depth + 1) for v in item.values())
            elif depth < _WALK_DEPTH and isinstance(item, list | tuple):
                stack.extend((v, depth + 1) for v in item)
    return total


def _nbytes(item: Any) -> int | None:
    """An array's bytes; None for what is no array; 0 for one that cannot say (a
    nested tensor has no numel(), a custom batch object's may raise)."""
    try:
        if hasattr(item, "element_size") and hasattr(item, "numel"):  # a torch tensor
            return int(item.numel()) * int(item.element_size())
        if hasattr(item, "nbytes") and hasattr(item, "shape") and hasattr(item, "dtype"):
            return int(item.nbytes)  # numpy
    except Exception:
        return 0
    return None


def to_device(batch: Any, device: Any) -> Any:
    if hasattr(batch, "to") and hasattr(batch, "element_size"):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list):
        return [to_device(v, device) for v in batch]
    if isinstance(batch, tuple):
        return tuple(to_device(v, device) for v in batch)
    return batch


class SampleFailed(Exception):
    """A sample of the user's map-style dataset raised: its index and the exception, in
    one line that survives torch's re-raise from a worker (which rebuilds the
    exception from its message)."""


class Named:
    """The user's map-style dataset, each sample's exception named with its index. The
    DataLoader calls only `__len__`, `__getitem__` and `__getitems__`; anything else
    (a worker_init_fn reading the dataset's attributes) reaches the user's dataset."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        if hasattr(dataset, "__getitems__"):
            self.__getitems__ = self._getitems

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: Any) -> Any:
        try:
            return self.dataset[i]
        except Exception as e:
            raise SampleFailed(f"sample {i} raised {one_line(e)}") from None

    def _getitems(self, indices: list[Any]) -> Any:
        try:
            return self.dataset.__getitems__(indices)
        except Exception as e:
            shown = indices if len(indices) <= 8 else [*indices[:8], "..."]
            raise SampleFailed(f"one of samples {shown} raised {one_line(e)}") from None

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"])  # type: ignore[misc]


class ChainedInit:
    """starvecheck's worker set-up (the worker dies with this process; signals:
    workers.worker_init), then the user's, then the parent-death signal armed again: a
    worker_init_fn that sets its own (SIGTERM, which the worker ignores, a common idiom)
    or clears it would let the worker outlive a SIGKILLed run. Made in the main process:
    its pid travels with it to workers started by spawn or forkserver too."""

    def __init__(self, user: Callable[[int], None] | None) -> None:
        self.user = user
        self.parent = os.getpid()

    def __call__(self, worker_id: int) -> None:
        worker_init(worker_id, self.parent)
        if self.user is not None:
            try:
                self.user(worker_id)
            finally:
                die_with_parent(self.parent, watched=False)


_IN_WORKER = re.compile(r"in DataLoader worker process (\d+)")


def worker_error(e: BaseException) -> str:
    """torch re-raises a worker's exception with its traceback in the message ("Caught
    ValueError in DataLoader worker process 0.\\nOriginal Traceback ..."): the
    exception's own last line, and which worker; a worker's death with its cause where
    it can be named (deaths.named: memory, /dev/shm)."""
    text = str(e)
    if "Original Traceback" in text:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        last = lines[-1]
        last = re.sub(r"^[\w.]*\bSampleFailed: ", "", last)
        worker = _IN_WORKER.search(lines[0])
        return named(last + (f" (in DataLoader worker {worker.group(1)})" if worker else ""))
    return text if isinstance(e, SampleFailed) else named(one_line(e))
