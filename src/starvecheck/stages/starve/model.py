"""The job `starve` simulates, and what two models predict it waits for its data.

Each sample costs D ms of CPU, batches of B go to a step of G ms, W workers share the
effective CPUs (Plan). The steady-state wait per step:
  CPU-aware:   max(0, D*B / min(W, effective CPUs) - G)   (W = 0: D*B, all on the main process)
  sleep model: max(0, D*B / W - G)                        (what a sleep-based benchmark predicts)
Apart from the run (sweep.py) and the stage (stage.py): pure arithmetic, read by both
and by the tests without a DataLoader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starvecheck.stages.options import StarveOptions


@dataclass(frozen=True)
class Plan:
    """The job simulated (D, B, G, the CPUs), the worker counts swept, and the run's steps."""

    sample_ms: float = StarveOptions.ASSUMED_SAMPLE_MS  # D
    batch_size: int = StarveOptions.batch_size  # B
    step_ms: float = StarveOptions.ASSUMED_STEP_MS  # G
    workers: tuple[int, ...] = (0, 1, 2, 4)
    steps: int = StarveOptions.STEPS[False]
    warmup_steps: int = StarveOptions.WARMUP_STEPS
    sleep: bool = False  # the sleep-based model: samples wait instead of working
    effective_cpus: int = 1
    tokenizer: str | None = None
    # doctor: after the sweep, measure the preprocessing capacity this many times
    # (0: not at all; the `starve` command does not).
    capacity_runs: int = 0
    # The inputs simulated with defaults rather than given ("sample_ms", "step_ms").
    assumed: tuple[str, ...] = ()

    def parameters(self) -> dict[str, Any]:
        return {
            "assumed": list(self.assumed),
            "sample_ms": self.sample_ms,
            "batch_size": self.batch_size,
            "step_ms": self.step_ms,
            "workers": list(self.workers),
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "work": "sleep" if self.sleep else ("tokenize" if self.tokenizer else "cpu"),
            "tokenizer": self.tokenizer,
            "effective_cpus": self.effective_cpus,
        }


def predicted_wait_ms(d_ms: float, b: int, g_ms: float, w: int, cpus: int) -> float:
    """Steady-state wait per step when W workers share `cpus` CPUs (CPU-bound work)."""
    if w == 0:
        return d_ms * b  # the main process makes every batch itself, between steps
    return max(0.0, d_ms * b / min(w, max(1, cpus)) - g_ms)


def sleep_model_wait_ms(d_ms: float, b: int, g_ms: float, w: int) -> float:
    """The same, if samples only waited (I/O, sleep): workers never compete for CPUs."""
    if w == 0:
        return d_ms * b
    return max(0.0, d_ms * b / w - g_ms)
