"""`attach PID`: where each process's sampled time went, one row per activity.

The JSON keeps one metric per share (`attach.main.data`, `attach.main.loading.decode`,
`attach.workers.read`, `attach.main.wait.read`, ...), labelled with `rank`, `pid`,
`quantity` (`main_share`: of the main thread's samples; `main_loading_share`: the main
thread's time inside the DataLoader, by what it did there; `worker_share`: of every
worker's samples; `exposed_share`: of the samples it waited for data in, by stage of
loading, `load_stage`) and `kind`, and each share's 95% interval (`low95`, `high95`),
the samples it was counted from (`samples`) and what they are worth as independent
draws (`samples_effective`: fewer where what they saw came in runs).
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.intervals import percent
from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.attach import MAIN_LOADING_SHARE, MAIN_SHARE, WORKER_SHARE
from starvecheck.core.schema.loading import EXPOSED_SHARE
from starvecheck.render.section import Section, taken

HEADERS = ("process", "thread", "doing", "share of its samples (95% interval, samples)")
WORTH_SAID = 0.9  # samples worth less than this share of their count: said
_WHO = {
    MAIN_SHARE: "training loop",
    MAIN_LOADING_SHARE: "  inside its data fetch",
    EXPOSED_SHARE: "  its wait, by stage",
    WORKER_SHARE: "DataLoader workers",
}
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


def split(metrics: Sequence[Metric]) -> tuple[list[tuple[str, ...]], list[Metric], list[str]]:
    rows: list[tuple[str, ...]] = []
    used: set[int] = set()
    for quantity, who in _WHO.items():
        for m in metrics:
            if m.labels.get("quantity") != quantity or m.value is None:
                continue
            used.add(id(m))
            rank = m.labels.get("rank")
            process = f"PID {m.labels.get('pid')}" + (f" rank {rank}" if rank is not None else "")
            doing = m.labels.get("kind", m.labels.get("load_stage"))
            if m.labels.get("from_workers"):
                doing = f"{doing} *"
            rows.append((process, who, str(doing), _share(m)))
    rows.sort(key=lambda r: (r[0], list(_WHO.values()).index(r[1])))
    rest = [m for m in metrics if id(m) not in used]
    return rows, rest, [NOTE] if rows else []


def _share(m: Metric) -> str:
    """`68.0% (63-73%, 400)`: the share, its 95% interval and its samples (`400 worth
    60` where they are worth fewer independent draws)."""
    low, high, n = m.labels.get("low95"), m.labels.get("high95"), m.labels.get("samples")
    if m.value is None:
        return ""
    if not isinstance(low, float | int) or not isinstance(high, float | int):
        return f"{m.value:.1%}"  # a report from before intervals were kept
    worth = m.labels.get("samples_effective")
    said = ""
    if isinstance(worth, float | int) and isinstance(n, int | float) and worth < WORTH_SAID * n:
        said = f" worth {worth:,.0f}"
    return f"{m.value:.1%} ({percent(float(low), float(high))}, {n}{said})"


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rows, rest, notes = split(metrics)
    if not rows:
        return [], rest
    return [Section(HEADERS, rows, notes, range(3, 4), metrics=taken(metrics, rest))], rest
