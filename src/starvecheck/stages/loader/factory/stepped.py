"""With --step-ms, the change read with the step: the count the sweep calls enough
(settled.knee_run) and the current settings read once more, in interleaved rounds of
their own, each with the step as a sleep after every batch (a GPU step leaves the CPUs
free, as a sleep does; configuration.py). Their samples a second are then a training
loop's, round by round (`StepRead`, the parameters' `step_read`), and the finding's
training figure is their ratio where the change it names is that count
(advice/factory_bounds.py). Elsewhere the model stands: loading and the step add up at
num_workers=0 and overlap with workers, the slower setting the pace.

Why it is read, not modelled: the model reads loading alone, and with workers it leaves
out what the training process pays to take each batch once its step ends while the
workers hold the CPUs. On 2 CPUs beside one busy process, a loop of 8-sample batches of
4 ms of Python each, at 2 workers and a 20 ms step, ran 30.5 ms a step where the model
said 25.6 (+19%; docs/performance.md, "The wait by stage").

Not read: without a step, where the count is the current one or changes more than the
count (its workers kept where yours restart every epoch), where either was read by
when its batches were made (made.py: batches too slow for windows, where a sleep between
them would not be measured), and for an IterableDataset (each configuration holds its
own, read once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from starvecheck.core.schema.factory import StepRead
from starvecheck.stages.loader.factory.figures import settings_of
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.outcome import Planned
from starvecheck.stages.loader.factory.rounds import read_rounds
from starvecheck.stages.loader.factory.run import Budget, Run
from starvecheck.stages.loader.factory.settled import knee_run
from starvecheck.stages.loader.factory.spare import Tally

STEP_ROUNDS = {False: 3, True: 2}  # full, --quick


def read_with_step(
    runs: Sequence[tuple[str, Run]],
    now: Config,
    plan: Planned,
    budget: Budget,
    read_one: Callable[[Config, Budget], Run],
    progress: Callable[[str], None],
    tally: Tally,
) -> list[StepRead]:
    """The count called enough and `now`, each read STEP_ROUNDS times with the step
    (`read_one` with `budget` sleeping plan.step_ms after every batch, the slices
    counted into `tally`): one StepRead, or none where not read (above)."""
    step_ms = plan.step_ms
    if not step_ms or step_ms <= 0:
        return []
    count = knee_run(list(runs), plan.effective_cpus)
    if count is None or count.config == now or count.made or not _count_only(count.config, now):
        return []
    rounds = STEP_ROUNDS[plan.quick]
    todo = [("current", now), ("count", count.config)]
    tally.total += len(todo) * rounds
    stepping = replace(budget, step_s=step_ms / 1e3)

    def said(what: str) -> None:
        progress(f"with your {step_ms:g} ms step: {what}")

    got = dict(read_rounds(todo, rounds, lambda c: read_one(c, stepping), said, least=rounds))
    mine, theirs = got["current"], got["count"]
    if mine.made or theirs.made or not mine.samples_per_s:
        return []
    if len(mine.samples_per_s) != len(theirs.samples_per_s):
        return []  # a round without a window: the two no longer pair round by round
    workers, prefetch, persistent, pin = settings_of(count.config).key
    read = StepRead(
        workers=workers,
        prefetch_factor=prefetch,
        persistent_workers=persistent,
        pin_memory=pin,
        step_ms=float(step_ms),
        current=tuple(round(x, 4) for x in mine.samples_per_s),
        changed=tuple(round(x, 4) for x in theirs.samples_per_s),
    )
    return [read]


def _count_only(count: Config, now: Config) -> bool:
    """`count` changes the worker count of `now` and nothing else the sweep sets. Where
    the counts were read with their workers kept (start-up-bound settings: epochs.py),
    the current settings restart theirs every epoch: read with the step, each slice
    would mostly start workers (4 workers unpickling 200 MB: 6 s a slice, the run past
    its 120 s), and the model stands (+7% there)."""
    return (count.persistent_workers, count.pin_memory, count.context) == (
        now.persistent_workers,
        now.pin_memory,
        now.context,
    )
