"""What judging reads: every stage result of one run, this machine's facts, the
workload. Its own module, below judge.py and every rule module, so that each rule
module can name it without importing the judge that imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starvecheck.core.model import StageResult
from starvecheck.core.schema.doctor import Context as DoctorContext

if TYPE_CHECKING:
    from starvecheck.inputs.workload import Workload
    from starvecheck.probe.machine import Machine


@dataclass(frozen=True)
class Results:
    """Everything one run measured, as judging sees it."""

    stages: Mapping[str, StageResult]
    machine: Machine | None = None  # this machine's facts (None for a trace of another run)
    workload: Workload | None = None  # doctor's; None for a single command
    doctor: DoctorContext = field(default_factory=DoctorContext)  # the GPU link's basis, ...

    def get(self, stage: str) -> StageResult | None:
        return self.stages.get(stage)

    def __contains__(self, stage: str) -> bool:
        return stage in self.stages
