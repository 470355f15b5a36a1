"""A job's analysis as figures: the headline rank's breakdown, labelled with its
quantity alone (as a one-rank trace always was), and, where there are several ranks
or GPUs, each one's figures labelled with its `rank` and `device`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.steps import HTA_PARTS, Phase, Step, StepFigure, StepFigures
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
HTA_SPLIT = ("host_wait", "kernel_wait", "other")  # HTA's idle categories, as HTA_PARTS
OTHER_RUNS_ANALYSED = 5  # other runs in the files given their own headline (advice says them)


def _hta(a: Analysis, part: str) -> float | None:
    """HTA's share of the idle time in this category, on the rank's headline GPU."""
    split = a.hta.get(a.device) if a.device is not None else None
    return None if split is None else split.ratio(part)


def _figure(
    q: Step,
    value: float | None,
    unit: str,
    reason: str = "not measured",
    rank: str | None = None,
    device: str | None = None,
) -> StepFigure:
    """One figure of a kind (steps, first_step_ms, gpu_idle_share, ...); missing, with
    the reason, where None. `rank` and `device` say whose it is, among several."""
    return StepFigure(q, Figure.maybe(value, reason), unit, rank=rank, device=device)


def _per_step(q: Step, values: Sequence[float], rank: str | None = None) -> StepFigure:
    """A figure timed in each measured step, in ms."""
    return StepFigure(q, Figure.repeated(values), "ms", rank=rank)


def _gpu_figures(a: Analysis, rank: str | None = None) -> list[StepFigure]:
    reason = a.gpu_reason or "not measured"
    waits = a.gpu_reason or NO_WAIT
    hta_reason = a.gpu_reason or "no kernels"
    figures: list[tuple[Step, float | None, str]] = [
        (Step.GPU_IDLE_SHARE, a.gpu_idle_share, reason),
        (Step.GPU_IDLE_DATA_WAIT_SHARE, a.gpu_idle_data_wait_share, waits),
        (Step.GPU_IDLE_OTHER_SHARE, a.gpu_idle_other_share, waits),
        *((q, _hta(a, part), hta_reason) for q, part in zip(HTA_PARTS, HTA_SPLIT, strict=True)),
        (Step.COLLECTIVE_SHARE, a.collective_share, reason),
        (Step.MEMCPY_SHARE, a.gpu(lambda d: d.memcpy), reason),
        (Step.MEMCPY_H2D_SHARE, a.copies("h2d"), reason),
        (Step.MEMCPY_H2D_PAGEABLE_SHARE, a.copies("h2d_pageable"), reason),
        (Step.MEMCPY_D2H_SHARE, a.copies("d2h"), reason),
        (Step.MEMCPY_D2D_SHARE, a.copies("d2d"), reason),
    ]
    return [_figure(q, v, "fraction", r, rank) for q, v, r in figures]


def breakdown(a: Analysis) -> list[StepFigure]:
    """One rank's figures, labelled with their quantity alone."""
    measured = a.measured
    out = [
        _figure(Step.STEPS, len(a.steps), "steps"),
        _per_step(Step.STEP_MS, [s.dur / 1e3 for s in measured]),
    ]
    if a.warmup:
        out.append(_figure(Step.FIRST_STEP_MS, a.steps[0].dur / 1e3, "ms"))
    if a.data_wait_share is not None:
        out.append(_figure(Step.DATA_WAIT_SHARE, a.data_wait_share, "fraction"))
        out.append(_per_step(Step.DATA_WAIT_MS, [s.data_wait / 1e3 for s in measured]))
    else:
        out.append(_figure(Step.DATA_WAIT_SHARE, None, "fraction", NO_WAIT))
        out.append(_figure(Step.DATA_WAIT_MS, None, "ms", NO_WAIT))
    out += _gpu_figures(a)
    for phase in a.phases:
        times = Figure.repeated([s.phases[phase] / 1e3 for s in measured])
        out.append(StepFigure(Step.PHASE_MS, times, "ms", Phase(phase.lower())))
    return out


# The GPU figures each rank of several has in the table of ranks.
_RANK_GPU = (Step.GPU_IDLE_SHARE, Step.COLLECTIVE_SHARE, Step.MEMCPY_H2D_SHARE)


def rank_figures(job: Job) -> list[StepFigure]:
    """Each rank's figures (labelled `rank`), with its work per common step; each GPU's
    idle where a rank drives several (labelled `device`)."""
    several = len(job.ranks) > 1
    common = set(job.common_steps)
    out: list[StepFigure] = []
    for a in job.ranks:
        if several:
            rank = a.name
            measured = a.measured
            work = [s.work / 1e3 for s in measured if s.name in common]
            out += [
                _figure(Step.STEPS, len(measured), "steps", rank=rank),
                _per_step(Step.STEP_MS, [s.dur / 1e3 for s in measured], rank),
                _figure(Step.DATA_WAIT_SHARE, a.data_wait_share, "fraction", NO_WAIT, rank),
                _per_step(Step.DATA_WAIT_MS, [s.data_wait / 1e3 for s in measured], rank)
                if a.data_wait_source
                else _figure(Step.DATA_WAIT_MS, None, "ms", NO_WAIT, rank),
                _per_step(Step.WORK_MS, work, rank),
            ]
            gpu = {f.quantity: f for f in _gpu_figures(a, rank)}
            out += [gpu[q] for q in _RANK_GPU]
        if len(a.devices) > 1:
            for d in a.devices:
                busy = a.device_share(d, lambda x: x.busy)
                idle = None if busy is None else max(0.0, 1 - busy)
                whose = a.name if several else None
                idle_d = _figure(Step.GPU_IDLE_SHARE, idle, "fraction", rank=whose, device=str(d))
                out.append(idle_d)
    return out


def _spread_caveat(step_ms: Figure | None) -> Caveat | None:
    if step_ms is None or step_ms.n < 2 or not step_ms.median or step_ms.stdev is None:
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
    found = StepFigures((*breakdown(a), *rank_figures(job)))
    several = len(job.ranks) > 1
    caveats = list(job.caveats)
    for r in job.ranks:
        caveats += [Caveat(c.id, f"{r.name}: {c}") if several else c for c in r.caveats]
    spread = _spread_caveat(found.figure(Step.STEP_MS))
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
        stage="trace", parameters=params, metrics=found.to_metrics(), caveats=tuple(caveats)
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
