"""`profile`'s training loop: one scenario (a layout, a num_workers) trained under
torch.profiler, each step five `record_function` phases (trainstep.PHASES):

    DATALOADER_WAIT  next(iter(DataLoader))
    H2D_TRANSFER     batch.to(device, non_blocking=True)
    FORWARD          model(input_ids, labels=input_ids)
    BACKWARD         loss.backward()
    OPTIMIZER        optimizer.step(); optimizer.zero_grad()

timed by the wall clock (on CUDA with a synchronize at the end of each phase, so
the GPU's work lands in its phase). Warm-up steps first, then with --cold the page
cache is evicted, then the profiled steps. With --trace-dir the scenario's Chrome
trace is kept.

Apart from the stage (stage.py), which writes the data, runs every scenario and makes
the figures: this is what one scenario does, and what it hands back (Steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.signals import check_signals, importing, signals_held
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S, Batches
from starvecheck.stages.dataloader.workers import prepare_workers, worker_init
from starvecheck.stages.options import ProfileOptions
from starvecheck.stages.samples import cache
from starvecheck.stages.samples.layouts import Layout
from starvecheck.stages.samples.residency import record_residency
from starvecheck.stages.trainstep import MODEL_SIZES, PHASES

LAYOUTS = ("small_files", "mds")


@dataclass(frozen=True)
class Plan:
    """One `profile` run: the model, the steps, the layouts and workers it goes over."""

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
    with importing("torch"):
        import torch
        from torch.profiler import ProfilerActivity, record_function, schedule

    cuda = plan.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = clocks.perf_counter
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    resident: float | None = None
    dataset = None
    try:
        with signals_held():
            dataset = source.make(0)
        loader = _dataloader(dataset, source, plan, workers)
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
                    resident = _evict(source.layout, residency_errors)
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


def _dataloader(dataset: Any, source: Any, plan: Plan, workers: int) -> Any:
    """A fresh DataLoader over `dataset` as the scenario reads it (pinned memory on
    CUDA, seeded shuffling, no persistent workers), its workers prepared."""
    with importing("torch"):
        import torch

    if workers:
        prepare_workers()
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=plan.batch_size,
        shuffle=source.shuffle,
        num_workers=workers,
        collate_fn=source.collate or _Collate(plan.shape[3]),
        pin_memory=plan.device == "cuda",
        prefetch_factor=2 if workers else None,
        persistent_workers=False,
        worker_init_fn=worker_init if workers else None,
        generator=torch.Generator().manual_seed(plan.seed),
    )


def _evict(layout: Layout, residency_errors: list[str]) -> float | None:
    """--cold, after the warm-up: the layout's files out of the page cache, and the
    fraction still cached after (None where it cannot be read)."""
    cache.evict(layout.paths, dir_fd=layout.dir_fd, sync=layout.sync, flags=layout.evict_flags)
    return record_residency(layout, residency_errors)
