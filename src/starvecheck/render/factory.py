"""`loader --factory`: one row per DataLoader configuration of the user's own pipeline.

The JSON keeps one flat metric per figure (`own.w2.samples_per_s`,
`own.w2.cpu_ms_per_sample.workers`, `own.w2.persistent.epoch_start_s`, ...), labelled
with layout `own`, the configuration (workers, prefetch_factor, persistent_workers,
pin_memory), `role` (workers: the num_workers sweep; prefetch, persistent, pin: one
setting changed at the sweep's knee; base and again: the knee and the user's
configuration read again beside those; current: the user's configuration where the
sweep does not include it) and `current`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starvecheck.core.criteria import FAR_BELOW
from starvecheck.core.metric import Metric, one, select
from starvecheck.core.model import StageResult
from starvecheck.core.schema.common import SAMPLES_PER_S, VS_CURRENT
from starvecheck.core.schema.factory import LAYOUT, MAIN, ROLE_START, WORKER, WORKERS
from starvecheck.core.schema.factory import Parameters as FactoryParameters
from starvecheck.core.schema.loading import EXPOSED_SHARE, SOLO_MS, LoadStage
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


def _setting(labels: Mapping[str, Any]) -> tuple[str, str, str]:
    workers = int(labels.get("workers", 0))
    if not workers:
        return "0", "", ""
    return (
        str(workers),
        str(labels.get("prefetch_factor")),
        "yes" if labels.get("persistent_workers") else "",
    )


def split(
    stage: StageResult, metrics: Sequence[Metric]
) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]], list[Metric], list[str]]:
    """(rows, cost rows, every other metric, notes) for the configurations of a factory
    run: one row per configuration in each table."""
    rows: list[tuple[str, ...]] = []
    costs: list[tuple[str, ...]] = []
    used: set[int] = set()
    for m in select(metrics, quantity=SAMPLES_PER_S, layout=LAYOUT):
        keys = ("role", "workers", "prefetch_factor", "persistent_workers", "pin_memory")
        mine = select(metrics, layout=LAYOUT, **{k: m.labels[k] for k in keys if k in m.labels})
        used.update(id(x) for x in mine)
        rows.append(_row(m, mine))
        costs.append(_cost(m, mine))
    rest = [m for m in metrics if id(m) not in used]
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
    return rows, costs, rest, notes


def _row(m: Metric, mine: Sequence[Metric]) -> tuple[str, ...]:
    def get(quantity: str, **more: Any) -> Metric | None:
        return one(mine, quantity=quantity, **more)

    ratio = get(VS_CURRENT)
    against = ""
    if ratio is not None and ratio.value is not None:
        against = f"{ratio.value:.2f}x"
    role = m.labels.get("role")
    mark = "current" if m.labels.get("current") and role not in ("base", "again") else ""
    if role == ROLE_START:  # the count beside, under the other start method
        mark = f"under {m.labels.get('start_method')}"
    return (
        *_setting(m.labels),
        _n(m, ",.0f"),
        f"{m.max / m.min:.2f}x" if m.n > 1 and m.min and m.max else "",
        against,
        _n(get("first_batch_s"), ".2f"),
        _n(get("epoch_start_s"), ".2f"),
        _n(get("batch_wait_ms", percentile=50), ".1f"),
        "beside" if role in ("base", "again") else mark,
    )


def _cost(m: Metric, mine: Sequence[Metric]) -> tuple[str, ...]:
    def get(quantity: str, **more: Any) -> Metric | None:
        return one(mine, quantity=quantity, **more)

    workers = int(m.labels.get("workers", 0))
    return (
        *_setting(m.labels),
        _n(get("cpu_ms_per_sample", process=MAIN), ".2f"),
        _n(get("cpu_ms_per_sample", process=WORKERS), ".2f") if workers else "",
        _n(get("runq_ms_per_sample", process="workers" if workers else "main"), ".2f"),
        _n(get("blocked_ms_per_sample", process=WORKERS), ".2f") if workers else "",
        _mib(get("uss_bytes", process=MAIN)),
        _mib(get("uss_bytes", process=WORKER)) if workers else "",
        _mib(get("uss_growth_bytes", process=WORKER)) if workers else "",
    )


def _n(m: Metric | None, fmt: str) -> str:
    if m is None:
        return ""
    return "n/a" if m.value is None else format(m.value, fmt)


def _mib(m: Metric | None) -> str:
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


def _stage_table(metrics: Sequence[Metric]) -> Section | None:
    """One row a configuration: each stage's share of its batches' wait, for the stages
    that take SHOWN_SHARE of some configuration's."""
    shares = select(metrics, quantity=EXPOSED_SHARE, layout=LAYOUT)
    if not shares:
        return None
    stages = [
        s
        for s in LoadStage
        if any(
            m.labels.get("load_stage") == s.value and (m.value or 0) >= SHOWN_SHARE for m in shares
        )
    ]
    keys = ("role", "workers", "prefetch_factor", "persistent_workers", "pin_memory")
    rows, seen = [], set()
    for m in shares:
        config = tuple(m.labels.get(k) for k in keys)
        if config in seen:
            continue
        seen.add(config)
        mine = select(metrics, layout=LAYOUT, **{k: m.labels[k] for k in keys if k in m.labels})
        cells = []
        for s in stages:
            x = one(mine, quantity=EXPOSED_SHARE, load_stage=s.value)
            cells.append("" if x is None or x.value is None else f"{x.value:.0%}")
        rows.append((*_setting(m.labels), *cells, _n(one(mine, quantity=SOLO_MS), ".1f")))
    headers = ("workers", "prefetch", "persist", *(s.value for s in stages), "made alone ms")
    title = "where each batch's wait goes"
    return Section(headers, rows, [STAGE_NOTE], range(0, len(headers)), title)


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    rows, costs, rest, notes = split(stage, metrics)
    if not rows:
        return [], rest
    title = f"your pipeline: {stage.parameters.read(FactoryParameters).factory}"
    shown = taken(metrics, rest)
    out = [
        Section(HEADERS, rows, [], range(0, len(HEADERS) - 1), title, shown),
        Section(COST_HEADERS, costs, notes, range(0, len(COST_HEADERS)), "what it costs"),
    ]
    stages = _stage_table(shown)
    return out + ([stages] if stages is not None else []), rest
