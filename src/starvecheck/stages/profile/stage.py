"""`profile`: a real training loop under torch.profiler, to see how the links add up.

A small causal language model (a GPT-2 configuration from transformers, randomly
initialised: nothing is downloaded) trains on token sequences stored two ways in a
fresh scratch directory: one file per sample, and MosaicML Streaming MDS shards
read by `StreamingDataset` (and, with --tokenizer, raw text tokenized in the
loader). Scenarios: every layout, every num_workers, each the profiled loop of
loop.py (five `record_function` phases per step). With --trace-dir each scenario's
Chrome trace is kept for TensorBoard or Perfetto (and for `starvecheck profile
--trace`). Here: the plan, the data, every scenario, and the figures.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.steps import Layout, Phase, ProfileFigures, Scenario
from starvecheck.core.signals import importing, signals_raise
from starvecheck.core.status import Unavailable, UsageError
from starvecheck.inputs.embedded import default_texts
from starvecheck.inputs.tokenizers import load_tokenizer
from starvecheck.scratch.directory import Scratch
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.dataloader.workers import quiet_torch
from starvecheck.stages.options import ProfileOptions
from starvecheck.stages.profile.loop import LAYOUTS, Plan, Steps, run_scenario
from starvecheck.stages.samples.residency import COLD_MAX_RESIDENT, resident_metric
from starvecheck.stages.timing import not_cold
from starvecheck.stages.trainstep import PHASES, build_model

TEXT_CHARS_PER_TOKEN = 5  # English runs ~4 characters a BPE token: enough text to fill a row


def summarize(results: dict[tuple[str, int], Steps], plan: Plan) -> list[Scenario]:
    """Each scenario's figures: its phases' and steps' ms, its data-wait share, its rate."""
    out: list[Scenario] = []
    for (layout, workers), steps in results.items():
        totals = steps.totals
        wait = sum(steps.phases["DATALOADER_WAIT"])
        phases = tuple(
            (Phase(name.lower()), Figure.repeated([s * 1e3 for s in steps.phases[name]]))
            for name in PHASES
        )
        out.append(
            Scenario(
                Layout(layout),
                workers,
                phases,
                step_ms=Figure.repeated([t * 1e3 for t in totals]),
                data_wait_share=Figure.single(wait / sum(totals)),
                samples_per_s=Figure.single(plan.batch_size * len(totals) / sum(totals)),
            )
        )
    return out


def resolve_device(requested: str) -> str:
    with importing("torch"):
        import torch

    available = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if available else "cpu"
    if requested == "cuda" and not available:
        raise Unavailable("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    return requested


def _measure(path: str, plan: Plan, ctx: RunContext) -> StageResult:
    from starvecheck.stages.dataloader import preflight
    from starvecheck.stages.samples.mds import streaming_or_why, unusable_under

    # Kineto logs each profiler start and stop to stderr at its default level, and
    # transformers warns about config fields: neither is news to the person reading.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    caveats: list[Caveat] = []
    params: dict[str, Any] = {"path": path, **plan.parameters()}
    streaming, why = streaming_or_why()
    if streaming is None:
        raise Unavailable(f"profile reads MDS shards and cannot load mosaicml-streaming: {why}")
    if skipped := unusable_under(path):
        # The other layouts are measured and kept; Streaming's is said not to be.
        streaming = None
        caveats.append(Caveat("profile.mds-skipped", f"the mds layout was not measured: {skipped}"))
    tokenizer = None
    if plan.tokenizer:
        # Loaded before anything is written: a name that is not there is one line.
        # Workers fork after the tokenizer has run in this process (num_workers=0):
        # without this, tokenizers warns on every fork and turns its threads off anyway.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        tokenizer = load_tokenizer(plan.tokenizer)
    plan = preflight.fitted(plan, plan.batch_size * plan.seq_len * 2, 2, ctx.warn)
    residency_errors: list[str] = []
    results, params["scratch"] = _scenarios(path, plan, ctx, streaming, tokenizer, residency_errors)
    if plan.device == "cuda":
        caveats.append(
            Caveat(
                "profile.synchronized",
                "phases are timed with torch.cuda.synchronize() at the end of each, so the "
                "GPU's work lands in its phase; an unsynchronised loop overlaps them a little "
                "more",
            )
        )
    scenarios, resident = summarize(results, plan), ()
    if plan.cold:
        resident, cold_caveats = _cold(results, residency_errors)
        caveats += cold_caveats
    if plan.trace_dir:
        caveats.append(
            Caveat(
                "profile.trace-dir",
                f"Chrome traces in {plan.trace_dir}: open in TensorBoard or "
                "https://ui.perfetto.dev, or read back with starvecheck profile --trace FILE",
            )
        )
    return StageResult(
        stage="profile",
        parameters=params,
        metrics=ProfileFigures(tuple(scenarios), resident).to_metrics(),
        caveats=tuple(caveats),
    )


def _scenarios(
    path: str,
    plan: Plan,
    ctx: RunContext,
    streaming: Any,
    tokenizer: Any | None,
    residency_errors: list[str],
) -> tuple[dict[tuple[str, int], Steps], str]:
    """The model built, the samples written in a fresh scratch directory under `path`
    (and the text layout with a tokenizer), every (layout, num_workers) scenario run,
    the data removed on every way out: each scenario's steps, and the scratch
    directory they read."""
    from starvecheck.stages.samples.plan import Plan as SamplePlan
    from starvecheck.stages.samples.sources import generate, text_source

    progress, warn = ctx.progress, ctx.warn
    model, optimizer = build_model(plan.model_size, plan.device, plan.seed)
    data_plan = SamplePlan(
        samples=plan.samples,
        sample_size=plan.seq_len * 2,  # u16 tokens
        workers=plan.workers,
        runs=1,
        batch_size=plan.batch_size,
        seed=plan.seed,
    )
    results: dict[tuple[str, int], Steps] = {}
    scratch = Scratch(path, prefix="starvecheck-profile-", warn=warn)
    try:
        with signals_raise(), quiet_torch(), warnings.catch_warnings(), scratch:
            warnings.filterwarnings("ignore", message=r".*Profiler clears events.*")
            try:
                sources = generate(scratch, data_plan, streaming, progress)
            finally:
                scratch.adopt("mds")
            if tokenizer is not None:
                texts = default_texts(plan.samples, chars=TEXT_CHARS_PER_TOKEN * plan.seq_len)
                texts = [texts[i % len(texts)] for i in range(plan.samples)]  # if prose ran out
                sources.append(text_source(scratch, texts, tokenizer, plan.seq_len, plan.shape[3]))
            chosen = [s for s in sources if s.name in plan.layouts]
            total = len(chosen) * len(plan.workers)
            for source in chosen:
                for workers in plan.workers:
                    progress(f"{source.name}, {workers} worker(s)", len(results), total)
                    try:
                        results[(source.name, workers)] = run_scenario(
                            source,
                            plan,
                            workers,
                            model,
                            optimizer,
                            f"{source.name}-w{workers}",
                            residency_errors,
                            ctx.batch_timeout_s,
                        )
                    except RuntimeError as e:
                        reason = " ".join(str(e).split())
                        raise Unavailable(f"the training loop failed: {reason}") from e
            progress("profiling", total, total)
    except OSError as e:
        raise UsageError(f"writing test data in {scratch.path} failed: {e.strerror}") from e
    finally:
        if scratch.leftovers:
            warn("could not remove everything starvecheck created: " + "; ".join(scratch.leftovers))
    return results, scratch.path


def _cold(
    results: dict[tuple[str, int], Steps], residency_errors: list[str]
) -> tuple[tuple[tuple[Layout, Figure], ...], list[Caveat]]:
    """--cold: what eviction left in the page cache, per layout, and its caveats."""
    resident: list[tuple[Layout, Figure]] = []
    caveats = [
        Caveat("profile.cold", "the page cache was evicted after the warm-up steps (--cold)")
    ]
    caveats += [Caveat("profile.residency-unknown", e) for e in residency_errors]
    for layout in LAYOUTS:
        known = [
            st.resident
            for (name, _), st in results.items()
            if name == layout and st.resident is not None
        ]
        if not known:
            continue
        figure = Figure.of(resident_metric(layout, known))
        if figure is not None:
            resident.append((Layout(layout), figure))
        if max(known) > COLD_MAX_RESIDENT:
            caveats.append(
                not_cold(
                    f"--cold: {max(known):.0%} of {layout} was still in the page cache "
                    "after eviction (tmpfs, or memory the kernel would not drop): its data "
                    "waits are not cold"
                )
            )
    return tuple(resident), caveats


@dataclass(frozen=True)
class ProfileRun:
    """What `profile` runs: the loop's Plan, over data written under `path`."""

    path: str
    plan: Plan


class ProfileStage(BaseStage[ProfileOptions, ProfileRun]):
    """`profile`'s loop in the registry (stages/base.Stage); `profile --trace` is the
    `trace` stage (stages/trace/)."""

    name = "profile"

    def plan(self, options: ProfileOptions, ctx: RunContext) -> ProfileRun:
        """`options` as the command parsed them (`path` checked, `trace_dir` made;
        `device` and `model_size` as given, "auto" for the default)."""
        eff = ctx.effective_cpus
        where = resolve_device(options.device)
        size = options.model_size
        if size == "auto":
            size = "small" if where == "cuda" else "tiny"
        quick = options.quick
        plan = Plan(
            workers=options.workers
            or tuple(sorted({0, min(eff, ProfileOptions.MAX_DEFAULT_WORKERS)})),
            steps=options.steps or ProfileOptions.STEPS[quick],
            warmup_steps=2 if quick else 3,
            model_size=size,
            device=where,
            cold=options.cold,
            trace_dir=options.trace_dir,
            effective_cpus=eff,
            tokenizer=options.tokenizer,
        )
        return ProfileRun(options.path, plan)

    def measure(self, plan: ProfileRun, ctx: RunContext) -> StageResult:
        return _measure(plan.path, plan.plan, ctx)


STAGE = ProfileStage()
