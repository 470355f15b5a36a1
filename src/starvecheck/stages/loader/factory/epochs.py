"""Workers started every epoch (`loader --factory`): a configuration's figure as a loop
reading epoch after epoch pays it, and the settings whose wait is that start-up.

A DataLoader without persistent_workers stops its workers at each epoch's end and
starts new ones at the next iter(): under forkserver or spawn each unpickles the
dataset first. Windows of batches that hold such a restart close a few batches after
it, counting a whole restart with part of its epoch (a window read 10 samples/s where a
loop got 19: epochs of 16 batches after a 3 s start-up); one that holds none leaves it
out (a forkserver reading cut by its budget before its first epoch ended read 1.3x
fork's pace where, epoch after epoch, it loads 0.57x). So such a configuration's figure
is an epoch's: its batches at their pace with the restarts taken out, plus one restart
(the median of those read, from the last batch before it to the epoch's first; where
none was read, the first epoch's start-up).

Also here: an error starting the workers as one line (`starting`), and a persistent-
workers DataLoader's second iter() (`restart`).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator
from typing import TYPE_CHECKING

from starvecheck.core import clocks
from starvecheck.core.schema.loading import LoadStage
from starvecheck.core.status import UsageError
from starvecheck.loading.split import INDEX
from starvecheck.stages.dataloader.batches import Batches
from starvecheck.stages.loader.factory.load import one_line
from starvecheck.stages.loader.factory.owndata import worker_error

if TYPE_CHECKING:
    from starvecheck.stages.loader.factory.load import Pipeline
    from starvecheck.stages.loader.factory.loaders import Built, Config
    from starvecheck.stages.loader.factory.run import Budget, Run


def per_epoch(run: Run, gaps: list[float], epoch: int | None, ours_s: float = 0.0) -> None:
    """Put an epoch's figure in `run` where its workers start every epoch: `gaps`, each
    restart read inside the windows; `epoch`, the batches of an epoch (None: unknown,
    the windows' figure stands); `ours_s`, starvecheck's own reading at the epochs'
    ends inside the windows (their processes' CPU and memory), in neither."""
    config = run.config
    if not config.workers or config.persistent_workers or not run.window_batches:
        return
    steady_s = run.window_s - sum(gaps) - ours_s
    steady = run.window_batches - len(gaps)
    if not epoch or steady <= 0 or steady_s <= 0:
        return
    gap = statistics.median(gaps) if gaps else run.first_batch_s
    per_batch = run.window_samples / run.window_batches
    epoch_s = gap + (epoch - 1) * steady_s / steady
    samples_per_s = per_batch * epoch / epoch_s
    run.samples_per_s = [samples_per_s]
    run.batches_per_s = [epoch / epoch_s]
    run.window_samples = round(samples_per_s * run.window_s)
    run.window_batches = round(epoch / epoch_s * run.window_s)


def length(built: Built) -> int | None:
    """The batches in an epoch of this configuration's DataLoader, where it has a len()."""
    try:
        n = len(built.inner if built.inner is not None else built.loader)
    except Exception:  # an IterableDataset, a loader of the user's own
        return None
    return n if n > 0 else None


def restarting(now: Config, fixed: bool) -> bool:
    """The current settings start their workers again every epoch, and are read
    (`fixed`: read as they are, or not at all)."""
    return not fixed and now.workers > 0 and not now.persistent_workers


def startup_bound(run: Run) -> bool:
    """Start-up (every epoch's new workers, inside the windows) holds the largest share
    of this reading's wait for its batches (stagesplit.py)."""
    split = run.split
    if split is None or not split.batches or not any(split.exposed):
        return False
    exposed = list(split.exposed)
    at = INDEX[LoadStage.STARTUP]
    return exposed[at] > 0 and exposed[at] == max(exposed)


@contextlib.contextmanager
def starting(pipeline: Pipeline, config: Config) -> Iterator[None]:
    """An error starting the workers (iter(loader): a dataset that cannot be pickled
    for a spawn or forkserver context, a worker_init_fn that raises) is one line."""
    try:
        yield
    except UsageError:
        raise
    except (Exception, SystemExit) as e:
        text = one_line(e)
        if "pickle" in text.lower():
            context = pipeline.settings.get("multiprocessing_context")
            how = f" ({getattr(context, '_name', context)})" if context else ""
            why = f"the dataset cannot be sent to worker processes{how}: {text}"
        else:
            why = worker_error(e)
        raise UsageError(
            f"loader --factory {pipeline.spec.text}: {config.describe()}: {why}"
        ) from e


def restart(built: Built, budget: Budget, what: str) -> float | None:
    """A second iter() on a persistent-workers DataLoader: its first batch."""
    started = clocks.perf_counter()
    with Batches(built.loader, budget.batch_timeout_s, "loader", what, keep=True) as it:
        try:
            next(it)
        except StopIteration:
            return None
        return clocks.perf_counter() - started
