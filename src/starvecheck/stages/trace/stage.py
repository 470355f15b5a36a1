"""A job's analysis as figures: the headline rank's breakdown, labelled with its
quantity alone (as a one-rank trace always was), and, where there are several ranks
or GPUs, each one's figures labelled with its `rank` and `device`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.common import PHASE_MS, STEP_MS
from starvecheck.core.schema.steps import Run as RunRecord
from starvecheck.core.status import UsageError
from starvecheck.inputs.files import TooLarge
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.options import TraceOptions
from starvecheck.stages.trace.analyze import Analysis, Job, analyze_job
from starvecheck.stages.trace.load import MAX_BYTES, Deadline, TooSlow, expand, load
from starvecheck.stages.trace.runs import Run, choose

SPREAD_WARNING = 0.10  # step-time stdev over the median, as pyperf warns
NO_WAIT = "no DataLoader fetch in the trace"
HTA_PARTS = ("host_wait", "kernel_wait", "other")
OTHER_RUNS_ANALYSED = 5  # other runs in the files given their own headline (advice says them)


def _hta(a: Analysis, part: str) -> float | None:
    """HTA's share of the idle time in this category, on the rank's headline GPU."""
    split = a.hta.get(a.device) if a.device is not None else None
    return None if split is None else split.ratio(part)


def _figure(
    name: str, value: float | None, unit: str, reason: str = "not measured", **where: Any
) -> Metric:
    """One figure of a kind (steps, first_step_ms, gpu_idle_share, ...): its quantity
    is its name; missing, with the reason, where None. `where` (rank, device) labels
    the figures of one rank or GPU among several."""
    labels = {"quantity": name, **where}
    flat = _flat(name, where)
    if value is None:
        return Metric.missing(flat, unit, reason, labels)
    return Metric.single(flat, value, unit, labels)


def _per_step(name: str, values: Sequence[float], **where: Any) -> Metric:
    """A figure timed in each measured step, in ms."""
    return Metric.repeated(_flat(name, where), values, "ms", {"quantity": name, **where})


def _flat(name: str, where: Mapping[str, Any]) -> str:
    """The flat name: the quantity, then the rank and device it is of (`step_ms.rank_0`)."""
    return ".".join([name, *(str(v) for v in where.values())]).replace(" ", "_")


def _gpu_figures(a: Analysis, **where: Any) -> list[Metric]:
    reason = a.gpu_reason or "not measured"
    waits = a.gpu_reason or NO_WAIT
    hta_reason = a.gpu_reason or "no kernels"
    figures: list[tuple[str, float | None, str]] = [
        ("gpu_idle_share", a.gpu_idle_share, reason),
        ("gpu_idle_data_wait_share", a.gpu_idle_data_wait_share, waits),
        ("gpu_idle_other_share", a.gpu_idle_other_share, waits),
        *((f"hta_idle_{part}_ratio", _hta(a, part), hta_reason) for part in HTA_PARTS),
        ("collective_share", a.collective_share, reason),
        ("memcpy_share", a.gpu(lambda d: d.memcpy), reason),
        ("memcpy_h2d_share", a.copies("h2d"), reason),
        ("memcpy_h2d_pageable_share", a.copies("h2d_pageable"), reason),
        ("memcpy_d2h_share", a.copies("d2h"), reason),
        ("memcpy_d2d_share", a.copies("d2d"), reason),
    ]
    return [_figure(n, v, "fraction", r, **where) for n, v, r in figures]


def breakdown(a: Analysis) -> list[Metric]:
    """One rank's figures, labelled with their quantity alone."""
    measured = a.measured
    out = [
        _figure("steps", len(a.steps), "steps"),
        _per_step("step_ms", [s.dur / 1e3 for s in measured]),
    ]
    if a.warmup:
        out.append(_figure("first_step_ms", a.steps[0].dur / 1e3, "ms"))
    if a.data_wait_share is not None:
        out.append(_figure("data_wait_share", a.data_wait_share, "fraction"))
        out.append(_per_step("data_wait_ms", [s.data_wait / 1e3 for s in measured]))
    else:
        out.append(_figure("data_wait_share", None, "fraction", NO_WAIT))
        out.append(_figure("data_wait_ms", None, "ms", NO_WAIT))
    out += _gpu_figures(a)
    for phase in a.phases:
        out.append(
            Metric.repeated(
                f"phase_ms.{phase.lower()}",
                [s.phases[phase] / 1e3 for s in measured],
                "ms",
                {"quantity": PHASE_MS, "phase": phase.lower()},
            )
        )
    return out


def rank_figures(job: Job) -> list[Metric]:
    """Each rank's figures (labelled `rank`), with its work per common step; each GPU's
    idle where a rank drives several (labelled `device`)."""
    several = len(job.ranks) > 1
    common = set(job.common_steps)
    out: list[Metric] = []
    for a in job.ranks:
        if several:
            where = {"rank": a.name}
            measured = a.measured
            out += [
                _figure("steps", len(measured), "steps", **where),
                _per_step("step_ms", [s.dur / 1e3 for s in measured], **where),
                _figure("data_wait_share", a.data_wait_share, "fraction", NO_WAIT, **where),
                _per_step("data_wait_ms", [s.data_wait / 1e3 for s in measured], **where)
                if a.data_wait_source
                else _figure("data_wait_ms", None, "ms", NO_WAIT, **where),
                _per_step("work_ms", [s.work / 1e3 for s in measured if s.name in common], **where),
            ]
            gpu = {m.labels["quantity"]: m for m in _gpu_figures(a, **where)}
            out += [
                gpu[name] for name in ("gpu_idle_share", "collective_share", "memcpy_h2d_share")
            ]
        if len(a.devices) > 1:
            for d in a.devices:
                where_d = {**({"rank": a.name} if several else {}), "device": str(d)}
                busy = a.device_share(d, lambda x: x.busy)
                idle = None if busy is None else max(0.0, 1 - busy)
                out.append(_figure("gpu_idle_share", idle, "fraction", **where_d))
    return out


def _spread_caveat(step_ms: Metric) -> Caveat | None:
    if step_ms.n < 2 or not step_ms.median or step_ms.stdev is None:
        return None
    spread = step_ms.stdev / step_ms.median
    if spread < SPREAD_WARNING:
        return None
    return Caveat(
        "trace.steps-vary",
        f"step time varies: stdev {step_ms.stdev:,.1f} ms is {spread:.0%} of the median "
        f"{step_ms.median:,.1f} ms (range {step_ms.min:,.1f} … {step_ms.max:,.1f} ms): "
        "shares are averages over unlike steps; profile more steps, or look for the slow ones",
    )


def result(job: Job | Analysis, path: str | os.PathLike[str] | Sequence[str]) -> StageResult:
    if isinstance(job, Analysis):
        job = Job((job,), ())
    a = job.headline
    found = breakdown(a) + rank_figures(job)
    several = len(job.ranks) > 1
    caveats = list(job.caveats)
    for r in job.ranks:
        caveats += [Caveat(c.id, f"{r.name}: {c}") if several else c for c in r.caveats]
    spread = _spread_caveat(next(m for m in found if m.labels == {"quantity": STEP_MS}))
    if spread:
        caveats.append(spread)
    paths = [os.fspath(path)] if isinstance(path, str | os.PathLike) else list(path)
    params: dict[str, Any] = {
        "trace": paths[0] if len(paths) == 1 else paths,
        "steps": len(a.steps),
        "measured_steps": len(a.measured),
        "warmup_steps": a.warmup,
        "stub_steps": a.stub,
        "whole_trace": a.whole_trace,
        "data_wait_source": a.data_wait_source,
        "dataloader": a.dataloader,
        "phases": [p.lower() for p in a.phases],
        "gpu_devices": len(a.devices),
        "gpu_device": None if a.device is None else str(a.device),
    }
    for key in ("world_size", "runs", "skipped"):
        if job.info.get(key):
            params[key] = job.info[key]
    if several:
        params["ranks"] = [
            {"rank": r.name, "file": r.path, "devices": [str(d) for d in r.devices]}
            for r in job.ranks
        ]
        params["headline_rank"] = a.name
        params["common_steps"] = list(job.common_steps)
    return StageResult(
        stage="trace", parameters=params, metrics=tuple(found), caveats=tuple(caveats)
    )


def read(
    paths: Sequence[str | os.PathLike[str]],
    max_bytes: int | None = MAX_BYTES,
    max_seconds: float | None = None,
) -> Job:
    """The job in the files: load (files in a folder that are not traces skipped with a
    note; one over `max_bytes` is not skipped, it ends the run) -> the run to analyse,
    each rank's cycles as one (runs.py) -> analyze; past `max_seconds` (None: no
    limit), the run ends in one line."""
    deadline = Deadline(max_seconds)
    loaded, skipped = [], []
    for path, listed in expand(paths):
        deadline.check(f"reading {path}")
        try:
            loaded.append(load(path, max_bytes))
        except TooLarge:
            raise
        except UsageError as e:
            if not listed:
                raise
            skipped.append(f"{os.path.basename(path)} ({str(e).split(': ', 1)[-1]})")
    if not loaded:
        raise UsageError(f"--trace: no trace among the files: {'; '.join(skipped)}")
    files, notes, runs = choose(loaded)
    if skipped:
        notes.append(
            Caveat(
                "trace.skipped",
                f"{len(skipped)} file(s) in the folder are not traces and were skipped: "
                + "; ".join(skipped[:5])
                + (f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""),
            )
        )
    job = analyze_job(files, deadline)
    info = {
        "files": [f.path for f in runs[0].files],
        "world_size": runs[0].job.world_size,
        "runs": [
            _run(r, deadline if 0 < i <= OTHER_RUNS_ANALYSED else None).to_dict()
            for i, r in enumerate(runs)
        ],
        "skipped": skipped,
    }
    return dataclasses.replace(job, caveats=job.caveats + tuple(notes), info=info)


def _run(run: Run, deadline: Deadline | None) -> RunRecord:
    """A run as the parameters record it; with a deadline, analysed on its own for its
    headline figures (advice/trace says them): its headline rank (the one that waits
    most for data, where it has several), that rank's data-wait share and mean step;
    or why it could not be analysed."""
    record = RunRecord(run.job.world_size, tuple(sorted(run.ranks)), len(run.files))
    if deadline is None:
        return record
    try:
        job = analyze_job(run.timelines(), deadline)
    except TooSlow:
        raise
    except UsageError as e:
        return dataclasses.replace(record, error=str(e))
    a = job.headline
    return dataclasses.replace(
        record,
        headline_rank=a.name if len(job.ranks) > 1 else None,
        data_wait_share=a.data_wait_share,
        step_ms=a.step_time / max(1, len(a.measured)) / 1e3,
    )


class TraceStage(BaseStage[TraceOptions, TraceOptions]):
    """`profile --trace FILE|DIR ...` in the registry (stages/base.Stage): torch.profiler
    traces of another run, analysed. Its result reports under `profile`
    (core/stages.py, `reported_as`: schema 1 named it so)."""

    name = "trace"

    def plan(self, options: TraceOptions, ctx: RunContext) -> TraceOptions:
        return options

    def measure(self, plan: TraceOptions, ctx: RunContext) -> StageResult:
        job = read(plan.traces, plan.max_bytes, plan.max_seconds)
        return result(job, job.info.get("files") or [os.fspath(p) for p in plan.traces])


STAGE = TraceStage()
