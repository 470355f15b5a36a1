"""Where a loop's wait for data goes, by stage of loading (core/schema/loading.py): each
stage's exposed ms a step and share of the wait, and its busy ms a batch wherever it
ran; each pass's worker start-up under the table."""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import LoadFigures
from starvecheck.core.schema.steps import Parameters
from starvecheck.render.section import Section, taken

HEADERS = ("stage", "exposed ms a step", "share of the wait", "busy ms a batch")
NOTE = (
    "exposed: the stage's part of the loop's wait for its batch (what prefetching did not "
    "hide; the stages add up to the wait); busy: its time a batch wherever it ran (in the "
    "workers, hidden while they keep ahead)"
)


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    """The table of the wait by stage, of the split's figures among `metrics` (those
    the tables before this one left), read as their record (LoadFigures)."""
    figures = LoadFigures.from_metrics(metrics)
    if not figures.stages:
        return [], list(metrics)
    rest = [m for m in metrics if not LoadFigures.holds(m)]
    rows: list[tuple[str, ...]] = []
    for w in figures.stages:
        exposed, share, busy = w.exposed_ms, w.exposed_share, w.busy_ms
        values = [x.value for x in (exposed, share, busy) if x is not None and x.value is not None]
        if not any(values):
            continue
        rows.append(
            (
                w.stage.value,
                _num(exposed),
                "" if share is None or share.value is None else f"{share.value:.1%}",
                _num(busy),
            )
        )
    notes = [NOTE]
    steps = figures.split_steps
    if steps is not None and steps.value is not None:
        notes.append(f"over the {int(steps.value)} steps whose batches carried a record")
    solo = figures.solo_ms
    if solo is not None and solo.value is not None:
        notes.append(
            f"a batch made alone (its fetch and collate, without waiting for a CPU): "
            f"{solo.value:,.1f} ms"
        )
    notes += _startup_notes(stage, figures)
    title = "where the data wait goes, by stage"
    used = taken(metrics, rest)
    return [Section(HEADERS, rows, notes, range(1, 4), title, used)], rest


def _num(m: Figure | None) -> str:
    if m is None or m.value is None:
        return ""
    return f"{m.value:,.1f}" if m.value >= 0.05 or m.value == 0 else f"{m.value:,.2f}"


def _startup_notes(stage: StageResult, figures: LoadFigures) -> list[str]:
    startup = figures.startup_s
    if startup is None or startup.value is None:
        return []
    params = stage.parameters.read(Parameters)
    how = f" ({params.start_method})" if params.start_method else ""
    passes = f", median of {startup.n} passes" if startup.n > 1 else ""
    said = f"workers{how} ready {startup.value:,.2f} s after their pass began{passes}"
    unpickle = figures.startup_unpickle_s
    if unpickle is not None and unpickle.value is not None:
        said += f"; {unpickle.value:,.2f} s of it each worker's own start before worker_init_fn"
    restart = figures.restart_exposed_ms
    if restart is not None and restart.value:
        said += (
            f"; the passes after the first waited {restart.value:,.1f} ms a step for it "
            "(persistent_workers=True starts them once)"
        )
    return [said]
