"""What `loader --factory` reports of its sweep (`result`): every configuration's
figures, labelled (figures.py), the run's parameters, and its caveats: a reading
disturbed and read again, windows cut short, what --quick leaves out, pin_memory
without CUDA, the multiprocessing context at num_workers=0, configurations not read,
and the fields the sample digest could not read. And the dataset's own count of shards,
read (a property of the user's) within the time limit and the exit guard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.factory import Configuration, FactoryFigures, Role, StepRead
from starvecheck.core.stages import FACTORY
from starvecheck.core.status import UsageError
from starvecheck.stages.loader.factory.figures import measured
from starvecheck.stages.loader.factory.guard import user_code
from starvecheck.stages.loader.factory.idle import start_method
from starvecheck.stages.loader.factory.load import Pipeline, call_limited, one_line
from starvecheck.stages.loader.factory.loaders import Config, current_config
from starvecheck.stages.loader.factory.rounds import ROUNDS
from starvecheck.stages.loader.factory.run import Run

if TYPE_CHECKING:
    from starvecheck.inputs.factory import FactorySpec


class Planned(Protocol):
    """What the result reads of the sweep's plan (stage.Plan), typed here so that this
    module need not import the stage that imports it."""

    @property
    def spec(self) -> FactorySpec: ...
    @property
    def quick(self) -> bool: ...
    @property
    def cuda(self) -> bool: ...
    @property
    def effective_cpus(self) -> int: ...
    @property
    def budget_s(self) -> float: ...
    @property
    def factory_timeout_s(self) -> float: ...
    @property
    def memory_limit_bytes(self) -> int | None: ...
    @property
    def shm_free_bytes(self) -> int | None: ...
    @property
    def rounds(self) -> int | None: ...
    @property
    def torch_threads(self) -> int | None: ...
    @property
    def idle_worker_uss_bytes(self) -> int | None: ...
    @property
    def step_ms(self) -> float | None: ...
    @property
    def pickle_bytes(self) -> int | None: ...
    @property
    def pickle_s(self) -> float | None: ...
    @property
    def pickle_error(self) -> str | None: ...
    @property
    def other_method(self) -> str | None: ...


DISTURBED = (
    "The first reading was disturbed: {what}; every worker count was read again, and the "
    "figures shown are the second reading's"
)


PARTIAL = (
    "{}: a window cut short of the prefetch queue's batches and two a worker (a dataset too "
    "slow for the --budget): its figure is not steady state; a larger --budget reads it whole"
)


NO_PIN = (
    "pin_memory not tried: torch sees no CUDA device, and pinned memory against pageable "
    "is measured only with each batch copied to one"
)

NO_CONTEXT = (
    "num_workers=0 was measured without the pipeline's multiprocessing_context ({}): "
    "DataLoader refuses one without workers, and the main process, loading every batch "
    "itself, starts nothing with it"
)


# A setting second to the count moves samples/s by a few percent, at the edge of its
# bar: three rounds cannot tell it from the noise (one quick run's line took
# prefetch_factor=4 at 1.15x, the next ones and the full run did not), so a quick run
# does not read them, and its line is never more than the full run's.
QUICK_COUNTS = (
    "--quick measured the worker counts only: prefetch_factor, persistent_workers and "
    "pin_memory are measured and judged by the run without --quick"
)


NOT_READ = (
    "Configurations not read, so not in the figures nor the comparison: {} (a dataset "
    "whose len() changed between reads, or epochs no longer than the prefetch queue)"
)


COUNTS_KEPT = (
    "The worker counts were read with persistent_workers=True: worker start-up held "
    "the largest share of your settings' wait (new workers every epoch), so the counts "
    "are compared as they feed the loop once their workers are kept; your settings "
    "were read as they are, beside them"
)


DIGEST_SKIPPED = (
    "Fields of the batches the sample digest could not read were left out of the "
    "right-data checks (samples repeated within an epoch): {}. The pipeline read them; "
    "its figures are whole"
)


def _digest_skipped(runs: Sequence[tuple[str, Run]]) -> str:
    """The fields the digest left out, over every configuration, most batches first."""
    counts: dict[str, int] = {}
    for _, run in runs:
        for why, n in run.digest_skipped.items():
            counts[why] = counts.get(why, 0) + n
    shown = sorted(counts, key=lambda w: -counts[w])[:4]
    return "; ".join(f"{why} ({counts[why]:,} batches)" for why in shown)


def _unread(run: Run) -> str:
    """Why a configuration has no figure, from what it read."""
    return (
        f"{run.config.describe()}: {run.batches} batches counted in {run.epochs} epoch(s), "
        "no window of samples/s"
    )


def _counts_kept(now: Config, runs: Sequence[tuple[str, Run]]) -> bool:
    """The counts were read with their workers kept where the current settings' are not
    (stage.py: their wait was start-up)."""
    return not now.persistent_workers and any(
        role == Role.WORKERS and run.config.workers and run.config.persistent_workers
        for role, run in runs
    )


def result(
    pipeline: Pipeline,
    plan: Planned,
    runs: Sequence[tuple[str, Run]],
    reread: Sequence[str] = (),
    stepped: Sequence[StepRead] = (),
) -> StageResult:
    now = current_config(pipeline)
    caveats = _caveats(pipeline, plan, runs, reread, now)
    configs = []
    for role, run in runs:
        configs.append(
            Configuration(
                role,
                run.config.workers,
                run.config.describe(),
                run.stopped,
                run.batches,
                run.samples,
                round(run.seconds, 3),
                run.epochs,
                run.partial,
            ).to_dict()
        )
    parameters: dict[str, Any] = {
        "source": FACTORY,
        "factory": plan.spec.text,
        "dataset": pipeline.describe(),
        "iterable": pipeline.iterable,
        "samples_in_dataset": pipeline.length,
        "given_dataloader": pipeline.given,
        "read_as_is": pipeline.fixed,
        "shuffle": bool(pipeline.settings.get("shuffle"))
        or type(pipeline.settings.get("sampler")).__name__ == "RandomSampler",
        "batch_size": pipeline.settings.get("batch_size"),
        "current": current_config(pipeline).describe(),
        "effective_cpus": plan.effective_cpus,
        "memory_limit_bytes": plan.memory_limit_bytes,
        "shm_free_bytes": plan.shm_free_bytes,
        "budget_s": plan.budget_s,
        # the rounds read: as many as planned, fewer where a set's rounds so far already
        # decided what judging makes of it (rounds.read_rounds)
        "rounds": max((len(r.samples_per_s) for _, r in runs), default=0)
        or plan.rounds
        or ROUNDS[plan.quick],
        "torch_threads": plan.torch_threads,
        "shards": _shards(pipeline, plan.factory_timeout_s),
        "start_method": start_method(pipeline.settings.get("multiprocessing_context")),
        "idle_worker_uss_bytes": plan.idle_worker_uss_bytes,
        "dataset_pickle_bytes": plan.pickle_bytes,
        "dataset_pickle_s": plan.pickle_s,
        "dataset_pickle_error": plan.pickle_error,
        "other_start_method": plan.other_method,
        "step_ms": plan.step_ms,
        "factory_s": round(pipeline.factory_s, 3),
        "configurations": configs,
        "reread": list(reread),
        "step_read": [r.to_dict() for r in stepped],
    }
    figures = FactoryFigures(tuple(measured(role, r, r.config == now) for role, r in runs))
    metrics = figures.to_metrics()  # the figures, filled once
    return StageResult(FACTORY, parameters=parameters, metrics=metrics, caveats=caveats)


def _caveats(
    pipeline: Pipeline,
    plan: Planned,
    runs: Sequence[tuple[str, Run]],
    reread: Sequence[str],
    now: Config,
) -> list[Caveat]:
    """What the reading says of itself: counts read again, windows cut short, fields the
    digest left out, counts read with their workers kept, configurations unread, --quick's
    counts only, no pin_memory without CUDA, a start method that num_workers=0 ignores
    (`now`: the current settings)."""
    caveats: list[Caveat] = []
    if reread:
        caveats.append(Caveat("loader.reread", DISTURBED.format(what="; ".join(reread))))
    short = [run.config.describe() for _, run in runs if run.partial]
    if short:
        caveats.append(Caveat("loader.partial-window", PARTIAL.format(", ".join(short))))
    skipped = _digest_skipped(runs)
    if skipped:
        caveats.append(Caveat("loader.digest-skipped", DIGEST_SKIPPED.format(skipped)))
    if _counts_kept(now, runs):
        caveats.append(Caveat("loader.counts-kept", COUNTS_KEPT))
    unread = [_unread(run) for _, run in runs if not run.samples_per_s]
    if unread:
        caveats.append(Caveat("loader.not-read", NOT_READ.format("; ".join(unread))))
    if plan.quick and not pipeline.fixed:
        caveats.append(Caveat("loader.quick-counts", QUICK_COUNTS))
    elif not plan.cuda and not pipeline.fixed:
        caveats.append(Caveat("loader.no-pin", NO_PIN))
    context = pipeline.settings.get("multiprocessing_context")
    if context is not None and any(not run.config.workers for _, run in runs):
        caveats.append(Caveat("loader.context-at-0", NO_CONTEXT.format(start_method(context))))
    return caveats


def _shards(pipeline: Pipeline, limit_s: float) -> int | None:
    """The dataset's own count of shards (Hugging Face's IterableDataset.num_shards,
    n_shards), where it has one; never computed by reading it. A property of the
    user's, read after the measurement: within --factory-timeout and the exit guard
    like every call into the pipeline's code; one that raises, exits or does not
    return is one line and exit 2 (an attribute it lacks is no count)."""
    where = f"loader --factory {pipeline.spec.text}"

    def read() -> int | None:
        for name in ("num_shards", "n_shards"):
            try:
                value = getattr(pipeline.dataset, name, None)
                # An int of the user's own class compares with its own code: an exact
                # int's value, read without calling it.
                count = int.__index__(value) if isinstance(value, int) else None
            except (Exception, SystemExit) as e:
                raise UsageError(f"{where}: the dataset's {name} raised {one_line(e)}") from e
            if count is not None and not isinstance(value, bool) and count > 0:
                return count
        return None

    with user_code():
        return call_limited(read, limit_s, f"{where}: the dataset's num_shards")
