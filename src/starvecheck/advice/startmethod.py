"""How `loader --factory`'s pipeline starts its workers, judged (`loader.start-method`):
the recommended count read under the other start method (the `start` configuration)
beside the same count under its own, round by round.

Under `fork` a worker inherits the dataset; under `forkserver` and `spawn` it receives
it pickled and unpickles it, every epoch without persistent workers. Python 3.14 made
`forkserver` the default on Linux: a pipeline that forks today is told what that move
costs it, measured, before it makes it (or that it cannot start there at all, where
its dataset does not pickle). One that starts under forkserver or spawn today is told
what fork would save.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starvecheck.advice.configurations import Point, points
from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult
from starvecheck.core.paired import MARGIN, compare
from starvecheck.core.schema.factory import Parameters as FactoryParameters
from starvecheck.core.schema.factory import Role
from starvecheck.core.schema.figure import value_of
from starvecheck.core.stages import FACTORY

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

COSTLY = 0.10  # the other method this much slower (or faster): worth a warning


def rules(results: Results) -> list[Finding]:
    loader = results.get(FACTORY)
    if loader is None:
        return []
    found = _unpicklable(loader) or _measured(loader)
    return [found] if found is not None else []


def _unpicklable(loader: StageResult) -> Finding | None:
    """A forking pipeline whose dataset does not pickle cannot start under forkserver."""
    p = loader.parameters.read(FactoryParameters)
    if p.start_method != "fork" or not p.dataset_pickle_error:
        return None
    return Finding(
        catalogue.LOADER_START_METHOD,
        Severity.WARNING,
        "Your dataset cannot start under forkserver, Python 3.14's default on Linux",
        evidence=(
            f"the pipeline's workers fork today (the dataset inherited); pickled as a "
            f"forkserver or spawn worker receives it, the dataset fails: {p.dataset_pickle_error}"
        ),
        recommendation=(
            "Before moving to Python 3.14 (or any interpreter or launcher that starts "
            "workers by forkserver or spawn), make the dataset pickle: keep open files, "
            "locks, database handles and generators out of its state (open them in "
            "worker_init_fn or on first use in __getitem__), or keep fork explicitly: "
            "`DataLoader(..., multiprocessing_context='fork')`."
        ),
        stage="loader",
    )


def _measured(loader: StageResult) -> Finding | None:
    found = points(loader)
    other = next((q for q in found if q.role == Role.START), None)
    if other is None:
        return None
    # the count the `start` configuration is read beside, in its rounds
    own = next((q for q in found if q.role == Role.BASE and q.workers == other.workers), None)
    if own is None:
        return None
    p = loader.parameters.read(FactoryParameters)
    method, mine = other.settings.start_method or "", p.start_method or "fork"
    c = compare(other.rates, own.rates)
    if c is None:
        return None
    evidence = _evidence(own, other, mine, method, c.describe(), p)
    if mine == "fork":
        return _leaving_fork(own, other, method, c.ratio, c.low, evidence)
    return _to_fork(own, other, mine, c.ratio, c.high, evidence)


def _evidence(
    own: Point, other: Point, mine: str, method: str, ratio: str, p: FactoryParameters
) -> str:
    text = (
        f"num_workers={own.workers} under {mine}: {own.rate:,.0f} samples/s; under {method}: "
        f"{other.rate:,.0f}; {method} over {mine}, round by round: {ratio}"
    )
    for q, name in ((own, mine), (other, method)):
        startup = value_of(q.figures.startup_s)
        if startup is not None:
            text += f"; workers ready {startup:,.2f} s after each epoch began under {name}"
            unpickle = value_of(q.figures.startup_unpickle_s)
            if unpickle is not None and name != "fork":
                text += f" ({unpickle:,.2f} s of it each worker's own start and unpickling)"
    if p.dataset_pickle_bytes is not None:
        text += (
            f"; the dataset pickles to {p.dataset_pickle_bytes / 1e6:,.1f} MB, which forkserver "
            "and spawn send to every worker"
        )
    return text


def _leaving_fork(
    own: Point, other: Point, method: str, ratio: float, low: float, evidence: str
) -> Finding:
    slower = ratio < 1 - COSTLY and low < 1 - MARGIN
    if not slower:
        return Finding(
            catalogue.LOADER_START_METHOD,
            Severity.INFO,
            f"Your pipeline loads as fast under {method}, Python 3.14's default on Linux "
            f"({ratio:.2f}x)",
            evidence=evidence,
            recommendation="Nothing to change before moving to Python 3.14.",
            stage="loader",
        )
    return Finding(
        catalogue.LOADER_START_METHOD,
        Severity.WARNING,
        f"Under {method}, Python 3.14's default on Linux, your pipeline loads {ratio:.2f}x "
        "as fast as it does now under fork",
        evidence=evidence,
        recommendation=(
            f"Before it moves to Python 3.14 (or starts its workers by {method} or spawn): "
            "keep the workers between epochs, `DataLoader(..., persistent_workers=True)` "
            "(they start once); make the dataset pickle small (load arrays and open files "
            "in the worker, in worker_init_fn or on first use, not in __init__); or keep fork "
            "explicitly, `DataLoader(..., multiprocessing_context='fork')`."
        ),
        gain=Gain(
            GainKind.THROUGHPUT,
            round(1 / ratio, 2),
            f"measured: fork over {method} at num_workers={own.workers}, round by round "
            "(what keeping fork, or the fixes above, keep)",
        ),
        stage="loader",
    )


def _to_fork(
    own: Point, other: Point, mine: str, ratio: float, high: float, evidence: str
) -> Finding | None:
    if ratio < 1 + COSTLY or high <= 1 + MARGIN:
        return None  # fork gains nothing worth a change
    return Finding(
        catalogue.LOADER_START_METHOD,
        Severity.WARNING,
        f"Your workers start by {mine}: fork loads {ratio:.2f}x as fast",
        evidence=evidence,
        recommendation=(
            f"Start the workers by fork where the job can (no CUDA in the parent before the "
            f"DataLoader starts, no threads that hold locks): "
            f"`DataLoader(..., multiprocessing_context='fork')`; or keep {mine} and keep the "
            "workers between epochs, `persistent_workers=True`, and make the dataset pickle "
            "small."
        ),
        gain=Gain(
            GainKind.THROUGHPUT,
            round(ratio, 2),
            f"measured: fork over {mine} at num_workers={own.workers}, round by round",
        ),
        stage="loader",
        fix={"multiprocessing_context": "fork"},
    )
