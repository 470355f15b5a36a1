"""`attach PID`: where each process's sampled time went, one row per activity.

The JSON keeps one metric per share (`attach.main.data`, `attach.main.loading.decode`,
`attach.workers.read`, `attach.main.wait.read`, ...), labelled with `rank`, `pid`,
`quantity` (`main_share`: of the main thread's samples; `main_loading_share`: the main
thread's time inside the DataLoader, by what it did there; `worker_share`: of every
worker's samples; `exposed_share`: of the samples it waited for data in, by stage of
loading, `load_stage`) and `kind`, and each share's 95% interval (`low95`, `high95`),
the samples it was counted from (`samples`) and what they are worth as independent
draws (`samples_effective`: fewer where what they saw came in runs). They are read as
attach's record (core/schema/attachfigures.AttachFigures, `StageResult.records`), by
field.
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.intervals import percent
from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.attach import (
    Interval,
    Loading,
    Main,
    Share,
    WaitPart,
)
from starvecheck.core.schema.attachfigures import AttachFigures, RankFigures
from starvecheck.core.schema.figure import Figure
from starvecheck.render.section import Section, taken

HEADERS = ("process", "thread", "doing", "share of its samples (95% interval, samples)")
WORTH_SAID = 0.9  # samples worth less than this share of their count: said
WHO = ("training loop", "  inside its data fetch", "  its wait, by stage", "DataLoader workers")
NOTE = (
    "Python stacks sampled by py-spy without pausing the job; idle threads counted "
    "(a thread blocked on a queue is waiting, not absent). training loop: the thread "
    "whose samples are in the DataLoader and the step (named in the JSON's ranks), "
    "the main thread where none is; inside its data fetch: its wait (the DataLoader's "
    "iteration, or its own fetch such as a get_batch), by what it did there (of all "
    "its samples); its wait, by stage: the stages of loading (docs/watch.md) as a share "
    "of the samples it waited for data in (* where its samples waiting on the queue for "
    "a worker are split by what the workers did over the window, not at the same "
    "moments). Each share with its 95% interval, counted from the samples in the order "
    "taken, and the samples it was counted from ('worth N' where one long wait sampled "
    "many times made them worth N independent samples). CPU, memory and reads from "
    "/proc are listed below."
)


Shares = Sequence[Share[Main]] | Sequence[Share[Loading]] | Sequence[WaitPart]


def _groups(r: RankFigures) -> tuple[Shares, Shares, Shares, Shares]:
    """A rank's shares in WHO's order."""
    return r.main, r.loading, r.wait, r.workers


def split(figures: AttachFigures) -> tuple[list[tuple[str, ...]], list[str]]:
    """The table's rows (by process, then WHO's order) and its note."""
    rows: list[tuple[str, ...]] = []
    for r in figures.ranks:
        process = f"PID {r.pid}" + (f" rank {r.rank}" if r.rank is not None else "")
        for who, shares in zip(WHO, _groups(r), strict=True):
            for s in shares:
                if s.value is None:
                    continue
                if isinstance(s, WaitPart):
                    doing = s.stage.value + (" *" if s.from_workers else "")
                else:
                    doing = s.kind.value
                rows.append((process, who, doing, _share(s.figure, s.interval)))
    rows.sort(key=lambda r: (r[0], WHO.index(r[1])))
    return rows, [NOTE] if rows else []


def _share(figure: Figure, ci: Interval) -> str:
    """`68.0% (63-73%, 400)`: the share, its 95% interval and its samples (`400 worth
    60` where they are worth fewer independent draws)."""
    if figure.value is None:
        return ""
    if ci.low is None or ci.high is None:
        return f"{figure.value:.1%}"  # a report from before intervals were kept
    n, worth = ci.samples, ci.effective
    said = ""
    if worth is not None and n is not None and worth < WORTH_SAID * n:
        said = f" worth {worth:,.0f}"
    return f"{figure.value:.1%} ({percent(float(ci.low), float(ci.high))}, {n}{said})"


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rest = [m for m in metrics if not AttachFigures.is_share(m)]
    if len(rest) == len(metrics):  # no share to show
        return [], list(metrics)
    rows, notes = split(stage.records(AttachFigures))
    return [Section(HEADERS, rows, notes, range(3, 4), metrics=taken(metrics, rest))], rest
