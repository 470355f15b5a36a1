"""The DataLoader each configuration of `loader --factory` reads: its settings
(`Config`), and the loader built from the user's pipeline with them (`make_loader`): a
DataLoader on the user's dataset, sampler and collate_fn; inside the user's own
loader-like object where FUNC returned one (WebDataset's WebLoader), so that object is
read as it is; the user's fixed iterable, as it is.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from starvecheck.core.signals import importing
from starvecheck.core.status import UsageError
from starvecheck.stages.dataloader.workers import stop_workers
from starvecheck.stages.loader.factory.load import Pipeline, one_line
from starvecheck.stages.loader.factory.owndata import ChainedInit, Named


@dataclass(frozen=True)
class Config:
    workers: int
    prefetch_factor: int | None = None  # None: torch's default (2) where workers > 0
    persistent_workers: bool = False
    pin_memory: bool = False
    # How the workers start where it is not the pipeline's own: "fork", "forkserver" or
    # "spawn" (the `start` configuration, read beside the count); None: the pipeline's.
    context: str | None = None

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_workers": self.workers, "pin_memory": self.pin_memory}
        if self.workers:
            out["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                out["prefetch_factor"] = self.prefetch_factor
            if self.context is not None:
                out["multiprocessing_context"] = self.context
        return out

    def describe(self) -> str:
        parts = [f"num_workers={self.workers}"]
        if self.workers and self.prefetch_factor is not None:
            parts.append(f"prefetch_factor={self.prefetch_factor}")
        if self.workers and self.persistent_workers:
            parts.append("persistent_workers=True")
        if self.pin_memory:
            parts.append("pin_memory=True")
        if self.workers and self.context is not None:
            parts.append(f"multiprocessing_context={self.context!r}")
        return ", ".join(parts)


def current_config(pipeline: Pipeline) -> Config:
    s = pipeline.settings
    workers = int(s.get("num_workers", 0) or 0)
    return Config(
        workers,
        s.get("prefetch_factor") if workers else None,
        bool(s.get("persistent_workers")) if workers else False,
        bool(s.get("pin_memory")),
    )


@dataclass
class Built:
    """What one configuration reads: `loader`, the DataLoader, or the user's loader-like
    object with our DataLoader inside (`inner`), or a fixed iterable read as it is
    (`inner` None)."""

    loader: Any
    inner: Any

    def iterator(self, it: Any) -> Any:
        """This epoch's DataLoader iterator (its workers), from the Batches `it`."""
        if self.inner is None:
            return None
        if self.inner is self.loader:
            return getattr(it, "_it", None)
        return getattr(self.inner, "held", None)

    def stop(self) -> None:
        """Stop the workers of a DataLoader inside another object: closing the outer
        iterator does not reach them."""
        if self.inner is not None and self.inner is not self.loader:
            stop_workers(getattr(self.inner, "held", None))


def make_loader(pipeline: Pipeline, config: Config) -> Built:
    """A DataLoader on the user's dataset with the user's sampler, collate and other
    settings, and `config`'s num_workers, prefetch_factor, persistent_workers and
    pin_memory; inside the user's loader-like object where FUNC returned one; the
    user's fixed iterable as it is."""
    if pipeline.fixed:
        return Built(pipeline.outer, None)
    with importing("torch"):
        from torch.utils.data import DataLoader

    mine = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "timeout")
    if config.context is not None:
        mine += ("multiprocessing_context",)
    kwargs = {k: v for k, v in pipeline.settings.items() if k not in mine}
    if not config.workers:
        # DataLoader refuses a multiprocessing_context without workers; the main
        # process loads the batches itself, so it has nothing to start (a caveat says).
        kwargs.pop("multiprocessing_context", None)
    if kwargs.get("batch_sampler") is not None:
        for k in ("batch_size", "drop_last", "sampler"):
            kwargs.pop(k, None)
    kwargs["worker_init_fn"] = (
        ChainedInit(kwargs.get("worker_init_fn"))
        if config.workers
        else kwargs.get("worker_init_fn")
    )
    dataset = pipeline.dataset if pipeline.iterable else Named(pipeline.dataset)
    if pipeline.rewrap is None:
        loader = DataLoader(dataset, **kwargs, **config.kwargs())
        return Built(loader, loader)
    inner = _held_loader()(dataset, **kwargs, **config.kwargs())
    return Built(pipeline.rewrap(inner), inner)


_HELD: list[type] = []


def _held_loader() -> type:
    """A DataLoader that keeps its current iterator (`held`): inside the user's object
    its iterator is out of reach, and its workers are read and stopped through it."""
    if not _HELD:
        with importing("torch"):
            from torch.utils.data import DataLoader

        class HeldLoader(DataLoader):  # type: ignore[misc]
            held: Any = None

            def __iter__(self) -> Any:
                self.held = super().__iter__()
                return self.held

        _HELD.append(HeldLoader)
    return _HELD[0]


def built_for(pipeline: Pipeline, config: Config) -> Built:
    """The configuration's loader, or one line: DataLoader refuses the settings, or the
    user's code it calls (the dataset's __len__, read by a sampler, the loader-like
    object's copy) raises or exits."""
    try:
        return make_loader(pipeline, config)
    except UsageError:
        raise
    except (ValueError, TypeError) as e:
        raise UsageError(
            f"loader --factory {pipeline.spec.text}: DataLoader({config.describe()}) refused "
            f"the pipeline's settings: {one_line(e)}"
        ) from e
    except (Exception, SystemExit) as e:
        raise UsageError(
            f"loader --factory {pipeline.spec.text}: making the DataLoader of "
            f"{config.describe()} raised {one_line(e)} (the dataset's __len__, its sampler)"
        ) from e


def count_workers(it: Any, counts: dict[int, int]) -> None:
    """Count the batches each worker delivers into `counts`: the DataLoader iterator's
    own hand-over (`_process_data(data, worker_idx)`, torch 2.2 and later) is wrapped on
    this iterator, which this configuration built. Nothing where torch does not say
    which worker; once on an iterator persistent workers reuse."""
    process = getattr(it, "_process_data", None)
    if process is None or getattr(process, "_starvecheck_counts", None) is counts:
        return
    try:
        named = list(inspect.signature(process).parameters)
    except (TypeError, ValueError):
        return
    if len(named) < 2:
        return

    def counted(data: Any, worker: int, *rest: Any) -> Any:
        counts[worker] = counts.get(worker, 0) + 1
        return process(data, worker, *rest)

    counted._starvecheck_counts = counts  # type: ignore[attr-defined]
    it._process_data = counted
