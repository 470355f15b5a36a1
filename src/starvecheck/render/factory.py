"""`loader --factory`: one row per DataLoader configuration of the user's own pipeline.

The JSON keeps one flat metric per figure (`own.w2.samples_per_s`,
`own.w2.cpu_ms_per_sample.workers`, `own.w2.persistent.epoch_start_s`, ...); this reads
them as their records (core/schema/factory.py: each configuration's `Measured`, its
`Role` and `Settings`, judging's ratio to the current one as its `VsCurrent`).
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.criteria import FAR_BELOW
from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.factory import BESIDE, FactoryFigures, Measured, Role, Settings
from starvecheck.core.schema.factory import Parameters as FactoryParameters
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import LoadStage
from starvecheck.render.section import Section, taken

HEADERS = (
    "workers",
    "prefetch",
    "persist",
    "samples/s",
    "spread",
    "vs current",
    "1st batch s",
    "epoch start s",
    "wait p50 ms",
    "",
)
# The second table: what each configuration costs the machine.
COST_HEADERS = (
    "workers",
    "prefetch",
    "persist",
    "CPU ms: main",
    "workers",
    "run queue",
    "blocked",
    "USS MiB: main",
    "worker",
    "growth",
)
MIB = float(1 << 20)


def _setting(s: Settings) -> tuple[str, str, str]:
    if not s.workers:
        return "0", "", ""
    return (str(s.workers), str(s.prefetch_factor), "yes" if s.persistent_workers else "")


def split(
    stage: StageResult, figures: FactoryFigures
) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]], list[str]]:
    """(rows, cost rows, notes) for the configurations of a factory run (its figures,
    judging's ratios with them): one row per configuration with a samples/s in each
    table."""
    rows = [_row(c) for c in figures.rated()]
    costs = [_cost(c) for c in figures.rated()]
    rounds = stage.parameters.read(FactoryParameters).rounds
    notes = [
        f"every configuration read once a round, {rounds or 'several'} rounds, each round "
        "in another order; samples/s: the median over the rounds (each round's figure over "
        "its own windows, epoch restarts included); spread: the largest figure over the "
        "smallest (blank: a count read in the first round only, under "
        f"{FAR_BELOW:.0%} of the best there, read no more); vs current: the ratio to your "
        "settings round by round (the median; "
        "its 90% interval in the JSON and the finding); beside: the count and your "
        "settings read again in the rounds of the count's variants, which compare with "
        "them. Per sample: CPU ms, user+system "
        "time in the training process and in all workers together; run queue, time ready "
        "to run but waiting for a CPU; blocked, the workers' time neither on a CPU nor "
        "waiting for one (I/O, sleep). USS: memory no other process shares, the median "
        "over workers, and each worker's growth over its longest round (every worker in "
        "the JSON)"
    ]
    return rows, costs, notes


def _row(c: Measured) -> tuple[str, ...]:
    rate = c.samples_per_s
    assert rate is not None
    ratio = c.vs_current.ratio if c.vs_current is not None else None
    against = f"{ratio:.2f}x" if ratio is not None else ""
    mark = "current" if c.current and c.role not in BESIDE else ""
    if c.role == Role.START:  # the count beside, under the other start method
        mark = f"under {c.settings.start_method}"
    return (
        *_setting(c.settings),
        _n(rate, ",.0f"),
        f"{rate.max / rate.min:.2f}x" if rate.n > 1 and rate.min and rate.max else "",
        against,
        _n(c.first_batch_s, ".2f"),
        _n(c.epoch_start_s, ".2f"),
        _n(c.wait_p50_ms, ".1f"),
        "beside" if c.role in BESIDE else mark,
    )


def _cost(c: Measured) -> tuple[str, ...]:
    workers = c.workers
    return (
        *_setting(c.settings),
        _n(c.cpu_ms_main, ".2f"),
        _n(c.cpu_ms_workers, ".2f") if workers else "",
        _n(c.runq_ms_workers if workers else c.runq_ms_main, ".2f"),
        _n(c.blocked_ms_workers, ".2f") if workers else "",
        _mib(c.uss_main),
        _mib(c.uss_worker) if workers else "",
        _mib(c.uss_growth_worker) if workers else "",
    )


def _n(m: Figure | None, fmt: str) -> str:
    if m is None:
        return ""
    return "n/a" if m.value is None else format(m.value, fmt)


def _mib(m: Figure | None) -> str:
    if m is None or m.value is None:
        return ""
    return f"{m.value / MIB:,.0f}"


SHOWN_SHARE = 0.02  # a stage under this share of every configuration's wait: no column
STAGE_NOTE = (
    "each batch's wait (the factory's loop asks for the next batch at once: a batch's "
    "whole time) split over the stages of loading, as a share of it: read, the dataset's "
    "fetch off a CPU; transform, on one; collate; handover, a worker's batch reaching the "
    "training process; startup, workers starting (an epoch's restart inside the windows); "
    "made alone: a batch's fetch and collate with a CPU of their own (what num_workers=0 "
    "spends on it)"
)


def _stage_table(rated: Sequence[Measured]) -> Section | None:
    """One row a configuration: each stage's share of its batches' wait, for the stages
    that take SHOWN_SHARE of some configuration's."""
    split = [c for c in rated if any(s.exposed_share is not None for s in c.split)]
    if not split:
        return None
    stages = [s for s in LoadStage if any((c.share(s) or 0) >= SHOWN_SHARE for c in split)]
    rows = []
    for c in split:
        cells = [f"{x:.0%}" if (x := c.share(s)) is not None else "" for s in stages]
        rows.append((*_setting(c.settings), *cells, _n(c.solo_ms, ".1f")))
    headers = ("workers", "prefetch", "persist", *(s.value for s in stages), "made alone ms")
    title = "where each batch's wait goes"
    return Section(headers, rows, [STAGE_NOTE], range(0, len(headers)), title)


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    figures = FactoryFigures.from_metrics(metrics)  # judging's ratios with the figures
    rated = figures.rated()
    rest = [m for m in metrics if not FactoryFigures.holds(m, rated)]
    rows, costs, notes = split(stage, figures)
    if not rows:
        return [], rest
    title = f"your pipeline: {stage.parameters.read(FactoryParameters).factory}"
    shown = taken(metrics, rest)
    out = [
        Section(HEADERS, rows, [], range(0, len(HEADERS) - 1), title, shown),
        Section(COST_HEADERS, costs, notes, range(0, len(COST_HEADERS)), "what it costs"),
    ]
    stages = _stage_table(rated)
    return out + ([stages] if stages is not None else []), rest
