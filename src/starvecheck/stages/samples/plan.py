"""What one `loader` sweep measures (its Plan): the samples and their size, the
num_workers swept, the epochs per point, the DataLoader's settings and the layouts.
The stage (stages/loader/: stage.py, epochs.py) and the layouts it reads
(stages/samples/sources.py) both take it; neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starvecheck.stages.options import LoaderOptions


@dataclass(frozen=True)
class Plan:
    samples: int
    sample_size: int
    workers: tuple[int, ...]
    runs: int
    batch_size: int = LoaderOptions.BATCH_SIZE
    prefetch_factor: int = LoaderOptions.prefetch_factor
    pin_memory: bool | None = None  # None: when CUDA is available
    cold: bool = LoaderOptions.cold
    effective_cpus: int = 1
    seed: int = 0
    # doctor measures only the workload's layout; None: every layout.
    layouts: tuple[str, ...] | None = None
    # Testing hook (STARVECHECK_SLOW_RANKS, read in cli/doctor.py): every sample of the
    # generated map-style layouts takes this much longer, as a slow node's would.
    sample_delay_ms: float = 0.0

    @property
    def temperatures(self) -> tuple[str, ...]:
        return ("cold", "warm") if self.cold else ("warm",)

    def wants(self, layout: str) -> bool:
        return self.layouts is None or layout in self.layouts

    def parameters(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.layouts is not None:
            extra["layouts"] = list(self.layouts)
        if self.sample_delay_ms:
            extra["sample_delay_ms"] = self.sample_delay_ms
        return extra | {
            "samples": self.samples,
            "sample_size_bytes": self.sample_size,
            "batch_size": self.batch_size,
            "workers": list(self.workers),
            "prefetch_factor": self.prefetch_factor,
            "runs": self.runs,
            "cold": self.cold,
            "effective_cpus": self.effective_cpus,
            "persistent_workers": False,
            "seed": self.seed,
        }
