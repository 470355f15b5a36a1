"""Where a loop's wait for data goes, by stage of loading (core/schema/loading.py): each
stage's exposed ms a step and share of the wait, and its busy ms a batch wherever it
ran; each pass's worker start-up under the table."""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.loading import (
    BUSY_MS,
    EXPOSED_MS,
    EXPOSED_SHARE,
    RESTART_EXPOSED_MS,
    SOLO_MS,
    SPLIT_STEPS,
    STARTUP_S,
    STARTUP_UNPICKLE_S,
    LoadStage,
)
from starvecheck.core.schema.steps import Parameters
from starvecheck.render.section import Section, taken

HEADERS = ("stage", "exposed ms a step", "share of the wait", "busy ms a batch")
_OWN = (EXPOSED_MS, EXPOSED_SHARE, BUSY_MS)
NOTE = (
    "exposed: the stage's part of the loop's wait for its batch (what prefetching did not "
    "hide; the stages add up to the wait); busy: its time a batch wherever it ran (in the "
    "workers, hidden while they keep ahead)"
)


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    cells: dict[tuple[str, str], Metric] = {}
    rest: list[Metric] = []
    steps = None
    singles: dict[str, Metric] = {}
    for m in metrics:
        q = str(m.labels.get("quantity"))
        if q in _OWN and set(m.labels) == {"quantity", "load_stage"}:
            cells[(q, str(m.labels["load_stage"]))] = m
        elif q == SPLIT_STEPS and set(m.labels) == {"quantity"}:
            steps = m
        elif q in (STARTUP_S, STARTUP_UNPICKLE_S, RESTART_EXPOSED_MS, SOLO_MS) and set(
            m.labels
        ) == {"quantity"}:
            singles[q] = m
        else:
            rest.append(m)
    if not cells:
        return [], list(metrics)
    rows = []
    for s in LoadStage:
        exposed, share, busy = (cells.get((q, s.value)) for q in _OWN)
        values = [x.value for x in (exposed, share, busy) if x is not None and x.value is not None]
        if not any(values):
            continue
        rows.append(
            (
                s.value,
                _num(exposed),
                "" if share is None or share.value is None else f"{share.value:.1%}",
                _num(busy),
            )
        )
    notes = [NOTE]
    if steps is not None and steps.value is not None:
        notes.append(f"over the {int(steps.value)} steps whose batches carried a record")
    solo = singles.get(SOLO_MS)
    if solo is not None and solo.value is not None:
        notes.append(
            f"a batch made alone (its fetch and collate, without waiting for a CPU): "
            f"{solo.value:,.1f} ms"
        )
    notes += _startup_notes(stage, singles)
    title = "where the data wait goes, by stage"
    used = taken(metrics, rest)
    return [Section(HEADERS, rows, notes, range(1, 4), title, used)], rest


def _num(m: Metric | None) -> str:
    if m is None or m.value is None:
        return ""
    return f"{m.value:,.1f}" if m.value >= 0.05 or m.value == 0 else f"{m.value:,.2f}"


def _startup_notes(stage: StageResult, singles: dict[str, Metric]) -> list[str]:
    startup = singles.get(STARTUP_S)
    if startup is None or startup.value is None:
        return []
    params = stage.parameters.read(Parameters)
    how = f" ({params.start_method})" if params.start_method else ""
    passes = f", median of {startup.n} passes" if startup.n > 1 else ""
    said = f"workers{how} ready {startup.value:,.2f} s after their pass began{passes}"
    unpickle = singles.get(STARTUP_UNPICKLE_S)
    if unpickle is not None and unpickle.value is not None:
        said += f"; {unpickle.value:,.2f} s of it each worker's own start before worker_init_fn"
    restart = singles.get(RESTART_EXPOSED_MS)
    if restart is not None and restart.value:
        said += (
            f"; the passes after the first waited {restart.value:,.1f} ms a step for it "
            "(persistent_workers=True starts them once)"
        )
    return [said]
