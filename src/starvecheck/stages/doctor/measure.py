"""`doctor`: every stage against one workload, measured; judging comes after.

Each selected stage (stages/registry.py) makes its plan from the workload first, so
an unreadable dataset, a missing tokenizer or too little free space is one line
before anything is measured; then the stages measure in DOCTOR_ORDER. doctor returns
their results untouched, with its own (the GPU step's caveat, testing hooks): the
chain (advice/capacity.py), the weakest link and the checklist (advice/chain.py) are
judgement, made once over all of them.

--quick sizes fit the whole run in under a minute on two CPU cores: each stage's own
--quick sizes, and fewer points where a stage sweeps (loader: the workload's layout
only, warm, num_workers up to the CPUs; starve: one worker count) because doctor only
needs each link's capacity at the recommended setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from starvecheck.core import clocks
from starvecheck.core import stages as stages_table
from starvecheck.core.model import StageResult
from starvecheck.core.schema.doctor import Context as DoctorContext
from starvecheck.core.signals import importing
from starvecheck.core.status import Unavailable, UsageError
from starvecheck.inputs.workload import ASSUMED_STEP_MS, Workload
from starvecheck.stages import registry
from starvecheck.stages.base import Progress, RunContext, timed

# The stages doctor runs, in chain order as --only names them (core/stages.py).
STAGES = stages_table.doctor_chain()


def select(only: str | None, skip: str | None) -> tuple[str, ...]:
    """--only/--skip -> the stages to run, in chain order (env always runs)."""

    def names(option: str, text: str) -> set[str]:
        got = {n.strip() for n in text.split(",")}
        bad = sorted(n for n in got if n not in STAGES)
        if bad or not got:
            raise UsageError(
                f"{option} {text!r}: unknown stage {', '.join(bad) or '(none)'}; "
                f"choose from {', '.join(STAGES)}"
            )
        return got

    if only is not None and skip is not None:
        raise UsageError("--only and --skip: choose one")
    chosen = set(STAGES)
    if only is not None:
        chosen = names("--only", only)
    if skip is not None:
        chosen -= names("--skip", skip)
    return tuple(s for s in STAGES if s in chosen)


def measured_by(name: str, w: Workload) -> str:
    """The stage that measures what --only/--skip call `name`: the loader link is the
    factory stage's where the workload names the user's own pipeline."""
    return stages_table.FACTORY if name == "loader" and w.factory is not None else name


def resolve_step(w: Workload, quick: bool, progress: Progress) -> tuple[Workload, str, str | None]:
    """(workload with step_ms, what the GPU link's figure is, a caveat or None)."""
    if w.step_ms is not None:
        return w, f"step_ms {w.step_ms:g} ({w.source('step_ms')})", None
    if cuda_present():
        from starvecheck.stages.doctor import gpustep

        progress("measuring the GPU step", 0, 1)
        m = gpustep.measure(w.batch_size, w.context, quick)
        progress("measuring the GPU step", 1, 1)
        w = w.set("step_ms", round(m.scaled_ms, 3), "measured")
        return w, f"step_ms {w.step_ms:g} measured", f"step_ms measured: {m.description}"
    w = w.set("step_ms", ASSUMED_STEP_MS, "assumed")
    return (
        w,
        f"step_ms {ASSUMED_STEP_MS:g} assumed (no CUDA device)",
        f"step_ms {ASSUMED_STEP_MS:g} is an assumed figure, not measured: there is no CUDA "
        "device here to time a training step on. It stands for a ~1B-parameter model at "
        "batch 16 x 2,048 tokens on one data-centre GPU; give --step-ms with your own "
        "step time (from your training logs) to judge the pipeline against your GPU",
    )


def cuda_present() -> bool:
    with importing("torch"):
        import torch

    return bool(torch.cuda.is_available())


@dataclass(frozen=True)
class Outcome:
    workload: Workload  # with step_ms resolved, and what the stages measured of it
    results: tuple[StageResult, ...]  # the stages' own, in chain order, then doctor's
    context: DoctorContext = field(default_factory=DoctorContext)


def run(
    w: Workload,
    stages: Sequence[str],
    quick: bool,
    ctx: RunContext,
) -> Outcome:
    """Every selected stage against the workload; the stages' results and doctor's own."""
    from starvecheck.core.signals import signals_raise

    start = clocks.perf_counter()
    caveats: list[str] = []
    with signals_raise():
        w, gpu_basis, step_caveat = resolve_step(w, quick, ctx.progress)
    if step_caveat:
        caveats.append(step_caveat)
    unavailable: dict[str, str] = {}
    plans: dict[str, Any] = {}
    for name in stages_table.doctor_run_order():  # every plan first: bad input before any measuring
        if name not in stages:
            unavailable[name] = f"{name} not selected (--only/--skip)"
            continue
        if name == "starve" and w.factory is not None:
            # The user's own pipeline is measured (loader): its decode and collate are
            # the CPU preprocessing, so starve's stand-in for them does not run.
            unavailable[name] = f"starve not run: the CPU work is measured in {w.factory.text}"
            continue
        stage = registry.get(measured_by(name, w))
        if (why := stage.unavailable()) is not None:
            unavailable[name] = why
            continue
        plans[name] = stage.doctor_plan(w, quick, ctx)
    results: dict[str, StageResult] = {}
    for name, plan in plans.items():
        stage = registry.get(measured_by(name, w))
        try:
            results[name] = timed(stage, plan, ctx).result
        except Unavailable as e:  # a stage failing mid-way (CUDA): its link says why
            unavailable[name] = str(e)
            continue
        w = stage.measured_workload(w, results[name])
    if ctx.slow_ms:
        caveats.append(
            f"STARVECHECK_SLOW_RANKS: every loader sample took {ctx.slow_ms:g} ms longer on "
            "purpose (a testing hook), so this node's loader figures are slowed"
        )
    own = StageResult(
        stage="doctor",
        parameters={"stages": list(stages), "quick": quick},
        caveats=tuple(caveats),
        duration_s=round(clocks.perf_counter() - start, 3),
    )
    ordered = (*(results[s] for s in STAGES if s in results), own)
    return Outcome(w, ordered, DoctorContext(gpu_basis, unavailable))


def with_caveats(results: Sequence[StageResult], caveats: Sequence[str]) -> list[StageResult]:
    """Caveats doctor learns after the stages ran (ranks sharing a host) join its own."""
    return [
        replace(r, caveats=(*r.caveats, *caveats)) if r.stage == "doctor" else r for r in results
    ]
