"""`starve`: does the input pipeline keep up with the GPU? A producer/consumer run.

Each sample costs D ms of real CPU work in a DataLoader worker (a busy loop that
counts this thread's CPU time, not wall time, so workers sharing a core really take
longer; or real tokenization with --tokenizer); batches of B go to a consumer that
takes G ms per step (a sleep, as a GPU step leaves the host CPU free). Per step,
after warm-up: the time blocked waiting for the batch and the compute time; the GPU
idle share is wait / (wait + compute).

Next to each measurement, two predictions of the steady-state wait (model.py: one
aware of the CPUs, one as a sleep-based benchmark sees it), so a person sees where
adding workers stops helping on this machine. The run itself is sweep.py's; here,
the plan, the figures, and the stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema import starve as figures
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.starve import StarveFigures, mean_of
from starvecheck.core.signals import importing
from starvecheck.inputs.embedded import default_texts
from starvecheck.inputs.tokenizers import load_tokenizer
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S
from starvecheck.stages.options import StarveOptions, default_workers
from starvecheck.stages.starve.model import Plan, predicted_wait_ms, sleep_model_wait_ms
from starvecheck.stages.starve.sweep import (
    PREFETCH,
    Point,
    Progress,
    calibrate_tokenizer_ms,
    capacity_workers,
    measure_capacity,
    samples,
    sweep,
)

if TYPE_CHECKING:
    from starvecheck.inputs.workload import Workload


def _no_progress(what: str, done: int, total: int) -> None:
    pass


def summarize(plan: Plan, d_ms: float, points: Sequence[Point]) -> StarveFigures:
    """The figures, named as the README promises (wait_ms.w<N>, predicted_wait_ms.w<N>,
    ...) where written: the sample's CPU time, and each worker count's."""
    made: list[figures.Point] = []
    for p in points:
        w = p.workers
        predicted = predicted_wait_ms(d_ms, plan.batch_size, plan.step_ms, w, plan.effective_cpus)
        naive = sleep_model_wait_ms(d_ms, plan.batch_size, plan.step_ms, w)
        made.append(
            figures.Point(
                w,
                wait_ms=mean_of(p.waits_ms),
                predicted_wait_ms=Figure.single(round(predicted, 3)),
                sleep_model_wait_ms=Figure.single(round(naive, 3)),
                compute_ms=mean_of(p.computes_ms),
                idle_share=Figure.single(round(p.idle_share, 4)),
                first_batch_s=Figure.single(round(p.first_batch_s, 4)),
            )
        )
    return StarveFigures(Figure.single(round(d_ms, 4)), tuple(made))


def run(
    plan: Plan,
    progress: Progress = _no_progress,
    warn: Callable[[str], None] = lambda m: None,
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> StageResult:
    from starvecheck.core.signals import signals_raise
    from starvecheck.stages.dataloader import preflight

    # A sample is a small tensor of token ids (or nothing, with --sleep): a batch is tiny.
    plan = preflight.fitted(plan, plan.batch_size * 4096, PREFETCH, warn)
    caveats: list[Caveat] = []
    tokenizer = texts = None
    d_ms = plan.sample_ms
    if plan.tokenizer:
        tokenizer = load_tokenizer(plan.tokenizer)
        texts = default_texts(256)
        d_ms = calibrate_tokenizer_ms(tokenizer, texts)
        caveats.append(
            Caveat(
                "starve.tokenizer",
                f"each sample is real tokenization of ~2,000 characters of English (standard "
                f"library docstrings) by {plan.tokenizer}: {d_ms:.3f} ms of CPU per sample, "
                "measured here; --sample-ms does not apply",
            )
        )
    if plan.sleep:
        caveats.append(
            Caveat(
                "starve.sleep",
                "--sleep: samples sleep instead of working, so workers never compete for "
                "CPUs; the sleep model's predictions hold, and real preprocessing will not "
                "match them",
            )
        )
    capacity = None
    extra: dict[str, Any] = {}
    with signals_raise():  # SIGTERM ends the sweep like Ctrl-C: workers are shut down
        points = sweep(plan, progress, tokenizer, texts, batch_timeout_s, d_ms)
        if plan.capacity_runs:
            w = capacity_workers(points, plan.effective_cpus)
            dataset = samples(plan, w, texts, tokenizer)
            capacity = measure_capacity(
                dataset, plan, w, plan.capacity_runs, progress, batch_timeout_s, d_ms
            )
            extra = {"capacity_workers": w, "capacity_runs": plan.capacity_runs}
    measured = summarize(plan, d_ms, points)
    with importing("torch"):
        import torch

    params = {
        **plan.parameters(),
        "sample_cpu_ms": round(d_ms, 4),
        "cuda": bool(torch.cuda.is_available()),
        **extra,
    }
    return StageResult(
        stage="starve",
        parameters=params,
        metrics=measured.to_metrics(),
        caveats=tuple(caveats),
        capacity=capacity,
    )


# doctor: 4 measured steps with --quick, 20 without; the capacity from 3 runs.
DOCTOR_STEPS = {True: 4, False: 20}
CAPACITY_RUNS = 3


class StarveStage(BaseStage[StarveOptions, Plan]):
    """`starve` in the registry (stages/base.Stage)."""

    name = "starve"

    def plan(self, options: StarveOptions, ctx: RunContext) -> Plan:
        from starvecheck.core.status import UsageError

        if options.sleep and options.tokenizer:
            raise UsageError("--sleep and --tokenizer: choose one kind of work per sample")
        # What the user did not give is simulated with defaults, and said so: findings
        # on it are hints about a made-up workload, never a verdict on theirs.
        sample_unknown = options.sample_ms is None and not options.tokenizer
        assumed = (("sample_ms",) if sample_unknown else ()) + (
            ("step_ms",) if options.step_ms is None else ()
        )
        return Plan(
            sample_ms=StarveOptions.ASSUMED_SAMPLE_MS
            if options.sample_ms is None
            else options.sample_ms,
            batch_size=options.batch_size,
            step_ms=StarveOptions.ASSUMED_STEP_MS if options.step_ms is None else options.step_ms,
            assumed=assumed,
            workers=options.workers or default_workers(ctx.effective_cpus),
            steps=options.steps or StarveOptions.STEPS[options.quick],
            warmup_steps=StarveOptions.WARMUP_STEPS,
            sleep=options.sleep,
            effective_cpus=ctx.effective_cpus,
            tokenizer=options.tokenizer,
        )

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> Plan:
        eff = ctx.effective_cpus
        assert workload.step_ms is not None
        return Plan(
            sample_ms=workload.cpu_ms_per_sample,
            batch_size=workload.batch_size,
            step_ms=workload.step_ms,
            workers=(eff,) if quick else tuple(x for x in default_workers(eff) if x <= eff),
            steps=DOCTOR_STEPS[quick],
            warmup_steps=StarveOptions.WARMUP_STEPS,
            effective_cpus=eff,
            # A cpu_ms_per_sample that was given is the job's whole preprocessing (decode,
            # augment, tokenize): it stands; the tokenizer then serves pad's lengths only.
            tokenizer=workload.tokenizer if _cpu_measured(workload) else None,
            capacity_runs=CAPACITY_RUNS,
        )

    def measure(self, plan: Plan, ctx: RunContext) -> StageResult:
        return run(plan, ctx.progress, ctx.warn, ctx.batch_timeout_s)

    def measured_workload(self, workload: Workload, result: StageResult) -> Workload:
        """With a tokenizer (and no cpu_ms_per_sample given), the CPU per sample is
        measured, not given."""
        if not workload.tokenizer or not _cpu_measured(workload):
            return workload
        return workload.set("cpu_ms_per_sample", result.parameters["sample_cpu_ms"], "measured")


def _cpu_measured(workload: Workload) -> bool:
    """Whether starve measures the CPU per sample by tokenizing: only where the job's
    cpu_ms_per_sample was not given."""
    return workload.source("cpu_ms_per_sample") == "default"


STAGE = StarveStage()
