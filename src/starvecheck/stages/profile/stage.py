"""`profile`: a real training loop under torch.profiler, to see how the links add up.

A small causal language model (a GPT-2 configuration from transformers, randomly
initialised: nothing is downloaded) trains on token sequences stored two ways in a
fresh scratch directory: one file per sample, and MosaicML Streaming MDS shards
read by `StreamingDataset`. Each step is five `record_function` phases:

    DATALOADER_WAIT  next(iter(DataLoader))
    H2D_TRANSFER     batch.to(device, non_blocking=True)
    FORWARD          model(input_ids, labels=input_ids)
    BACKWARD         loss.backward()
    OPTIMIZER        optimizer.step(); optimizer.zero_grad()

timed by the wall clock (on CUDA with a synchronize at the end of each phase, so
the GPU's work lands in its phase). Warm-up steps first, then with --cold the page
cache is evicted, then the profiled steps. Scenarios: every layout, every
num_workers. With --trace-dir each scenario's Chrome trace is kept for TensorBoard
or Perfetto (and for `starvecheck profile --trace`).
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.signals import check_signals, importing, signals_held, signals_raise
from starvecheck.core.status import Unavailable, UsageError
from starvecheck.inputs.embedded import default_texts
from starvecheck.inputs.tokenizers import load_tokenizer
from starvecheck.scratch.directory import Scratch
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S, Batches
from starvecheck.stages.dataloader.workers import prepare_workers, quiet_torch, worker_init
from starvecheck.stages.options import ProfileOptions
from starvecheck.stages.samples import cache
from starvecheck.stages.samples.residency import (
    COLD_MAX_RESIDENT,
    record_residency,
    resident_metric,
)
from starvecheck.stages.timing import not_cold
from starvecheck.stages.trainstep import MODEL_SIZES, PHASES, build_model

LAYOUTS = ("small_files", "mds")
TEXT_CHARS_PER_TOKEN = 5  # English runs ~4 characters a BPE token: enough text to fill a row


@dataclass(frozen=True)
class Plan:
    workers: tuple[int, ...]
    steps: int = ProfileOptions.STEPS[False]
    warmup_steps: int = 3
    model_size: str = "tiny"
    device: str = "cpu"
    cold: bool = False
    trace_dir: str | None = None
    effective_cpus: int = 1
    seed: int = 0
    tokenizer: str | None = None  # adds the text layout: raw text tokenized in the loader

    @property
    def layouts(self) -> tuple[str, ...]:
        return (*LAYOUTS, "text") if self.tokenizer else LAYOUTS

    @property
    def shape(self) -> tuple[int, int, int, int, int, int]:
        return MODEL_SIZES[self.model_size]

    @property
    def batch_size(self) -> int:
        return self.shape[5]

    @property
    def seq_len(self) -> int:
        return self.shape[4]

    @property
    def samples(self) -> int:
        """Enough for the warm-up and profiled steps of one scenario, once through."""
        return self.batch_size * (self.warmup_steps + self.steps + 1)

    def parameters(self) -> dict[str, Any]:
        layers, heads, width, vocab, seq, batch = self.shape
        return {
            "model": f"GPT-2 configuration, {layers} layers, {heads} heads, width {width}",
            "model_size": self.model_size,
            "vocab_size": vocab,
            "seq_len": seq,
            "batch_size": batch,
            "device": self.device,
            "workers": list(self.workers),
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "cold": self.cold,
            "trace_dir": self.trace_dir,
            "effective_cpus": self.effective_cpus,
            "seed": self.seed,
            "layouts": list(self.layouts),
            "tokenizer": self.tokenizer,
        }


def collate_tokens(batch: list[Any], vocab: int) -> Any:
    """Stored samples (raw bytes: a tensor, or MDS's {"data": ndarray}) -> token ids
    [batch, seq_len]: the bytes read as little-endian u16, modulo the vocabulary."""
    import numpy as np
    import torch

    rows = []
    for sample in batch:
        if isinstance(sample, dict):
            sample = sample["data"]
        if isinstance(sample, np.ndarray):
            sample = torch.from_numpy(np.ascontiguousarray(sample))
        rows.append(sample)
    data = torch.stack(rows)
    return data.view(torch.int16).to(torch.int64).remainder_(vocab)


class _Collate:
    """Picklable collate_fn (a closure would not survive a spawn start method)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __call__(self, batch: list[Any]) -> Any:
        return collate_tokens(batch, self.vocab)


@dataclass
class Steps:
    """Per profiled step, seconds in each phase."""

    phases: dict[str, list[float]]
    resident: float | None = None  # --cold: the fraction still cached after eviction

    @property
    def totals(self) -> list[float]:
        return [sum(p) for p in zip(*self.phases.values(), strict=True)]


def run_scenario(
    source: Any,
    plan: Plan,
    workers: int,
    model: Any,
    optimizer: Any,
    trace_name: str,
    residency_errors: list[str],
    batch_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Steps:
    """Warm-up, eviction (with --cold), profiled steps, each batch within
    `batch_timeout_s` (0: no limit); workers shut down and the dataset released on
    every way out."""
    with importing():
        import torch
        from torch.profiler import ProfilerActivity, record_function, schedule

    cuda = plan.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = time.perf_counter
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    resident: float | None = None
    dataset = None
    try:
        with signals_held():
            dataset = source.make(0)
        if workers:
            prepare_workers()
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=plan.batch_size,
            shuffle=source.shuffle,
            num_workers=workers,
            collate_fn=source.collate or _Collate(plan.shape[3]),
            pin_memory=cuda,
            prefetch_factor=2 if workers else None,
            persistent_workers=False,
            worker_init_fn=worker_init if workers else None,
            generator=torch.Generator().manual_seed(plan.seed),
        )
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        handler = (
            torch.profiler.tensorboard_trace_handler(plan.trace_dir, worker_name=trace_name)
            if plan.trace_dir
            else None
        )
        with (
            Batches(loader, batch_timeout_s, "profile", source.name) as it,
            torch.profiler.profile(
                activities=activities,
                schedule=schedule(wait=0, warmup=plan.warmup_steps, active=plan.steps),
                on_trace_ready=handler,
            ) as prof,
        ):
            for step in range(plan.warmup_steps + plan.steps):
                check_signals()
                if step == plan.warmup_steps and plan.cold:
                    layout = source.layout
                    cache.evict(
                        layout.paths,
                        dir_fd=layout.dir_fd,
                        sync=layout.sync,
                        flags=layout.evict_flags,
                    )
                    resident = record_residency(layout, residency_errors)
                marks = [clock()]
                with record_function("DATALOADER_WAIT"):
                    batch = next(it)
                marks.append(clock())
                with record_function("H2D_TRANSFER"):
                    batch = batch.to(plan.device, non_blocking=True)
                    sync()
                marks.append(clock())
                with record_function("FORWARD"):
                    loss = model(input_ids=batch, labels=batch).loss
                    sync()
                marks.append(clock())
                with record_function("BACKWARD"):
                    loss.backward()
                    sync()
                marks.append(clock())
                with record_function("OPTIMIZER"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    sync()
                marks.append(clock())
                prof.step()
                if step >= plan.warmup_steps:
                    for name, a, b in zip(PHASES, marks, marks[1:], strict=False):
                        phases[name].append(b - a)
    finally:
        if dataset is not None:
            with signals_held():
                source.release(dataset)
    return Steps(phases, resident)


def summarize(results: dict[tuple[str, int], Steps], plan: Plan) -> list[Metric]:
    out: list[Metric] = []
    for (layout, workers), steps in results.items():
        key = f"{layout}.w{workers}"
        where = {"layout": layout, "workers": workers}
        for name in PHASES:
            out.append(
                Metric.repeated(
                    f"phase_ms.{name.lower()}.{key}",
                    [s * 1e3 for s in steps.phases[name]],
                    "ms",
                    {"quantity": "phase_ms", "phase": name.lower(), **where},
                )
            )
        totals = steps.totals
        wait = sum(steps.phases["DATALOADER_WAIT"])
        out.append(
            Metric.repeated(
                f"step_ms.{key}", [t * 1e3 for t in totals], "ms", {"quantity": "step_ms", **where}
            )
        )
        out.append(
            Metric.single(
                f"data_wait_share.{key}",
                wait / sum(totals),
                "fraction",
                {"quantity": "data_wait_share", **where},
            )
        )
        out.append(
            Metric.single(
                f"samples_per_s.{key}",
                plan.batch_size * len(totals) / sum(totals),
                "samples/s",
                {"quantity": "samples_per_s", **where},
            )
        )
    return out


def resolve_device(requested: str) -> str:
    with importing():
        import torch

    available = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if available else "cpu"
    if requested == "cuda" and not available:
        raise Unavailable("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    return requested


def _measure(path: str, plan: Plan, ctx: RunContext) -> StageResult:
    from starvecheck.stages.dataloader import preflight
    from starvecheck.stages.samples.mds import streaming_or_why
    from starvecheck.stages.samples.plan import Plan as SamplePlan
    from starvecheck.stages.samples.sources import generate, text_source

    progress, warn = ctx.progress, ctx.warn
    start = time.perf_counter()
    # Kineto logs each profiler start and stop to stderr at its default level, and
    # transformers warns about config fields: neither is news to the person reading.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    caveats: list[Caveat] = []
    params: dict[str, Any] = {"path": path, **plan.parameters()}
    streaming, why = streaming_or_why()
    if streaming is None:
        raise Unavailable(f"profile reads MDS shards and cannot load mosaicml-streaming: {why}")
    tokenizer = None
    if plan.tokenizer:
        # Loaded before anything is written: a name that is not there is one line.
        # Workers fork after the tokenizer has run in this process (num_workers=0):
        # without this, tokenizers warns on every fork and turns its threads off anyway.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        tokenizer = load_tokenizer(plan.tokenizer)
    plan = preflight.fitted(plan, plan.batch_size * plan.seq_len * 2, 2, warn)
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
    residency_errors: list[str] = []
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
    params["scratch"] = scratch.path
    if plan.device == "cuda":
        caveats.append(
            Caveat(
                "profile.synchronized",
                "phases are timed with torch.cuda.synchronize() at the end of each, so the "
                "GPU's work lands in its phase; an unsynchronised loop overlaps them a little "
                "more",
            )
        )
    metrics = summarize(results, plan)
    if plan.cold:
        caveats.append(
            Caveat("profile.cold", "the page cache was evicted after the warm-up steps (--cold)")
        )
        caveats += [Caveat("profile.residency-unknown", e) for e in residency_errors]
        for layout in LAYOUTS:
            known = [
                st.resident
                for (name, _), st in results.items()
                if name == layout and st.resident is not None
            ]
            if not known:
                continue
            metrics.append(resident_metric(layout, known))
            if max(known) > COLD_MAX_RESIDENT:
                caveats.append(
                    not_cold(
                        f"--cold: {max(known):.0%} of {layout} was still in the page cache "
                        "after eviction (tmpfs, or memory the kernel would not drop): its data "
                        "waits are not cold"
                    )
                )
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
        metrics=tuple(metrics),
        caveats=tuple(caveats),
        duration_s=round(time.perf_counter() - start, 3),
    )


@dataclass(frozen=True)
class ProfileRun:
    """What `profile` runs: the loop's Plan, over data written under `path`."""

    path: str
    plan: Plan


class ProfileStage(BaseStage[ProfileOptions, ProfileRun]):
    """`profile`'s loop in the registry (stages/base.Stage); `profile --trace` is the
    `trace` stage (stages/trace.py)."""

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
