"""The worker counts of `loader --factory` that fit the machine, checked before any
worker starts, as `loader` checks its own (stages/dataloader/preflight.py): the
open-file limit and the cgroup's pids limit, for the default sweep as for `--workers`,
and /dev/shm, for the batches the workers hold in it. What does not fit is left out
with a warning that says why; where nothing fits, one line and exit 2.

The batch's bytes, which /dev/shm must hold `prefetch_factor` of per worker, are read
from one batch of the pipeline at num_workers=0 (a map-style dataset; an
IterableDataset may keep state from its reader, so only the margin is checked for it).
Where /dev/shm is roomy, one sample is read instead: batch_size times its bytes, ROOM
times over, fitting every count settles it without a whole batch (1.6 s of --quick's 30
at 100 ms a sample and batch 16). A batch more than ROOM times its first sample's share
(padded to a far longer sample) could still fill /dev/shm: the worker it kills is
named by its SIGBUS (stages/dataloader/deaths.py).
And workers started by spawn or forkserver must be able to import FILE.py by name.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from starvecheck.core.signals import importing
from starvecheck.core.status import UsageError
from starvecheck.stages.dataloader import preflight
from starvecheck.stages.dataloader.batches import Batches
from starvecheck.stages.loader.factory.load import Pipeline
from starvecheck.stages.loader.factory.loaders import Config, built_for
from starvecheck.stages.loader.factory.owndata import Named, batch_figures


def check_files(counts: Sequence[int]) -> None:
    """Before the user's module is imported: the soft open-file limit raised towards
    what `counts` need, and one line where not even num_workers=0 fits."""
    preflight.fit_open_files(counts)


def fit_run(
    pipeline: Pipeline,
    counts: Sequence[int],
    current: Config,
    batch_timeout_s: float,
    warn: Callable[[str], None],
    spare: int | None = None,
) -> tuple[tuple[int, ...], bool, bool]:
    """(the counts swept that fit the open-file limit, the cgroup's pids limit and
    /dev/shm's free space, whether the current configuration's count does, whether
    `spare` does: a count --quick may add once its first round asks for it); what does
    not fit among `counts`, said in one warning (never the spare's). None fitting: one
    line and exit 2."""
    # Each read at most once, whichever check asks first.
    batch = functools.cache(lambda: batch_bytes(pipeline, batch_timeout_s))
    sample = functools.cache(lambda: sample_bytes(pipeline, batch_timeout_s))

    def fitted(wanted: tuple[int, ...]) -> tuple[preflight.Fit, str]:
        files = preflight.fit_open_files(wanted)
        tasks = preflight.fit_tasks(files.workers, preflight.tasks_free())
        fit = preflight.Fit(tasks.workers, None)
        free = preflight.shm_free()
        if free is not None:
            prefetch = current.prefetch_factor or 2
            fit = preflight.fit_shm(fit.workers, 0, prefetch, free)  # the margin alone, first
            if any(fit.workers) and fit.workers == tasks.workers:
                guess = sample() * ROOM
                roomy = guess and preflight.fit_shm(fit.workers, guess, prefetch, free) == fit
                fit = fit if roomy else preflight.fit_shm(fit.workers, batch(), prefetch, free)
        return fit, "; ".join(w for w in (files.warning, tasks.warning, fit.warning) if w)

    wanted = tuple(sorted({*counts, current.workers}))
    fit, said = fitted(tuple(sorted({*wanted, spare})) if spare is not None else wanted)
    spare_fits = spare is not None and spare in fit.workers
    if spare is not None and not spare_fits:
        fit, said = fitted(wanted)
    kept = tuple(w for w in counts if w in fit.workers)
    fits_now = current.workers in fit.workers
    if not kept and not fits_now:
        raise UsageError(said or "no worker count fits")
    if said:
        warn(said)
    return kept, fits_now, spare_fits


def batch_bytes(pipeline: Pipeline, limit_s: float) -> int:
    """One batch's bytes, read at num_workers=0; 0 where none is read (an
    IterableDataset, an iterable read as it is, a sample that raises: the sweep says
    what it raises)."""
    if pipeline.fixed or pipeline.iterable:
        return 0
    batch = _first(pipeline, limit_s, lambda: built_for(pipeline, Config(0)).loader)
    if batch is None:
        return 0
    return batch_figures(batch, pipeline.settings.get("batch_size"))[1]


# How many times one sample's share of a batch must fit, for the sample to stand for it.
ROOM = 16


def sample_bytes(pipeline: Pipeline, limit_s: float) -> int:
    """batch_size times one sample's bytes, collated alone by the pipeline's collate_fn
    at num_workers=0; 0 where there is no such sample (a batch_sampler, the user's
    loader-like object, what batch_bytes reads nothing of, a sample that raises)."""
    settings = pipeline.settings
    size = settings.get("batch_size")
    plain = settings.get("batch_sampler") is None and pipeline.rewrap is None
    if pipeline.fixed or pipeline.iterable or not plain or not isinstance(size, int):
        return 0
    with importing("torch"):
        from torch.utils.data import DataLoader

    def one() -> Any:
        first = next(iter(built_for(pipeline, Config(0)).loader.sampler))
        return DataLoader(
            Named(pipeline.dataset), batch_size=1, sampler=[first],
            collate_fn=settings.get("collate_fn"), num_workers=0,
        )  # fmt: skip

    sample = _first(pipeline, limit_s, one)
    return 0 if sample is None else size * batch_figures(sample, 1)[1]


def _first(pipeline: Pipeline, limit_s: float, make: Callable[[], Any]) -> Any:
    """The first batch of the loader `make()` builds, read at num_workers=0 within
    `limit_s`; None where there is none or reading it raises (the sweep reads the
    pipeline again and says what it raises). One line (UsageError) passes through."""
    try:
        with Batches(make(), limit_s, "loader", pipeline.describe(), workers=0) as it:
            return next(it, None)
    except UsageError:
        raise
    except (Exception, SystemExit):
        return None


def check_spawnable(pipeline: Pipeline) -> None:
    """Workers started by spawn or forkserver import FILE.py by the name its classes
    carry; where it had to be imported under a private name (its stem is no Python
    name, or a module already imported has it), they cannot, and each would print its
    traceback before the run ends in "exited unexpectedly": one line instead, where what
    the workers are sent names that module."""
    import pickle

    from starvecheck.stages.loader.factory.idle import start_method

    path = pipeline.spec.path
    if path is None or start_method(pipeline.settings.get("multiprocessing_context")) == "fork":
        return
    full = os.path.abspath(path)
    name = next(
        (
            n
            for n, m in list(sys.modules.items())
            if n.startswith("_starvecheck_factory_") and getattr(m, "__file__", None) == full
        ),
        None,
    )
    if name is None:
        return
    sent = (pipeline.dataset, *(pipeline.settings.get(k) for k in ("worker_init_fn", "collate_fn")))
    try:
        named = name.encode() in pickle.dumps(sent)
    except Exception:  # what cannot be pickled is said as the workers start
        return
    if named:
        raise UsageError(
            f"loader --factory {pipeline.spec.text}: workers started by "
            f"{start_method(pipeline.settings.get('multiprocessing_context'))} import "
            f"{os.path.basename(path)} by its name, which they cannot: "
            f"{os.path.basename(path)[:-3]!r} is no Python module name, or a module of that "
            "name is already imported; rename the file"
        )
