"""The contract every measuring stage keeps, and what a run hands it.

A stage is an object with a `name` and four methods (the `Stage` protocol): whether
it can run here, a plan from a command's options, a plan from doctor's workload,
and `measure(plan, ctx)`, which returns a `StageResult` with metrics, caveats and,
where the stage can state it, its capacity in samples/s, but never findings:
judging (`advice.judge`) runs once per report over every stage's result.

Stages register in `stages/registry.py`; commands and doctor reach them only there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from starvecheck.model import StageResult
from starvecheck.stages.batches import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from starvecheck.probe.machine import Machine
    from starvecheck.workload import Workload

Progress = Callable[[str, int, int], None]  # (what, done, total)
Warn = Callable[[str], None]


def no_progress(what: str, done: int, total: int) -> None:
    pass


def no_warning(message: str) -> None:
    pass


@dataclass(frozen=True)
class RunContext:
    """What every stage may use while it measures: this machine's facts, the
    environment, and where to report progress and warnings (never stdout)."""

    machine: Machine | None = None
    environ: Mapping[str, str] = field(default_factory=dict)
    progress: Progress = no_progress
    warn: Warn = no_warning
    path: str | None = None  # the directory a stage writes its data under (doctor's PATH)
    slow_ms: float = 0.0  # testing hook (STARVECHECK_SLOW_RANKS): slower loader samples
    # --batch-timeout: a DataLoader that delivers no batch for this long ends the run in
    # one line (stages/batches.py); 0: no limit.
    batch_timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def effective_cpus(self) -> int:
        """The CPUs DataLoader workers really get (affinity and quota), at least 1."""
        cpus = self.machine.cpu.effective_cpus if self.machine is not None else None
        return max(1, cpus or 1)

    @property
    def storage(self) -> dict[str, Any]:
        """The facts about the storage under the path measured (kind, network, ...)."""
        return self.machine.to_dict()["storage"] if self.machine is not None else {}


P = TypeVar("P")


@dataclass(frozen=True)
class OnDisk(Generic[P]):
    """A stage's plan with where it reads: under `path`, generated data or (`existing`)
    the user's own files there (io, loader)."""

    path: str
    existing: bool
    plan: P


class Stage(Protocol):
    name: str

    def unavailable(self) -> str | None:
        """Why this stage cannot measure here (exit 3), or None."""
        ...

    def plan(self, options: Mapping[str, Any], ctx: RunContext) -> Any:
        """The plan for the stage's own command, from its parsed options; bad
        options raise UsageError (one line, exit 2) before anything is measured."""
        ...

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> Any:
        """The plan doctor runs against a workload."""
        ...

    def measure(self, plan: Any, ctx: RunContext) -> StageResult:
        """Measure; metrics carry labels, findings stay empty."""
        ...


# Optional, where a stage measures part of doctor's workload (starve with a tokenizer
# measures the CPU per sample): `measured_workload(workload, result) -> Workload`.
