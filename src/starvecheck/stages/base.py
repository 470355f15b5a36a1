"""The contract every measuring stage keeps, and what a run hands it.

A stage is an object with a `name` and four methods (the `Stage` protocol, generic
over its options type and its plan type): whether it can run here; `plan(options,
ctx)`, from its command's options, a frozen dataclass of stages/options.py that the
command built from values already parsed (cli/args.py), so a stage checks only how
options combine; a plan from doctor's workload; and `measure(plan, ctx)`, which
returns a `StageResult` with metrics, caveats and, where the stage can state it, its
capacity in samples/s, but never findings: judging (`advice.judge`) runs once per
report over every stage's result.

Three abilities are optional, and `BaseStage` gives each its default, so commands
(`cli/common.measure_one`) and doctor call every stage alike: `refusal` (why its
command cannot measure here, after planning, and what it reports anyway: pcie's host
side), `measure_all` (the result and what a command shows besides it: env's facts,
pad's layouts) and `measured_workload` (what it measured of doctor's workload:
starve's CPU per sample).

Stages register in `stages/registry.py`; commands and doctor reach them only there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from starvecheck.core import clocks
from starvecheck.core.model import StageResult
from starvecheck.stages.dataloader.batches import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from starvecheck.core.jsonvalue import JsonObject
    from starvecheck.core.schema.pad import PaddedRun
    from starvecheck.inputs.workload import Workload
    from starvecheck.probe.machine import Machine

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
    # one line (stages/dataloader/batches.py); 0: no limit.
    batch_timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def effective_cpus(self) -> int:
        """The CPUs DataLoader workers really get (affinity and quota), at least 1."""
        cpus = self.machine.cpu.effective_cpus if self.machine is not None else None
        return max(1, cpus or 1)

    @property
    def storage(self) -> JsonObject:
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


OptionsT = TypeVar("OptionsT", contravariant=True)  # the stage's options (stages/options.py)
PlanT = TypeVar("PlanT")  # the stage's plan


@dataclass(frozen=True)
class Measured:
    """A stage's result, and what its command shows besides it."""

    result: StageResult
    machine: Machine | None = None  # env: the facts read, which are the report's machine
    # pad: the lengths and layouts behind the figures (--plot draws a batch of each), a
    # stages.pad.Run; not named here, so that this module, below every stage, imports none.
    pad_run: PaddedRun | None = None  # pad --plot: what the picture is drawn from


@dataclass(frozen=True)
class Refusal:
    """Why a stage will not measure in this run (exit 3), and what it reports anyway
    (pcie without a CUDA device: the host side)."""

    message: str
    result: StageResult | None = None


class Stage(Protocol[OptionsT, PlanT]):
    name: str

    def unavailable(self) -> str | None:
        """Why this stage cannot measure here (exit 3), or None."""
        ...

    def plan(self, options: OptionsT, ctx: RunContext) -> PlanT:
        """The plan for the stage's own command, from its typed options (parsed by the
        command); bad combinations raise UsageError (one line, exit 2) before anything
        is measured."""
        ...

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> PlanT:
        """The plan doctor runs against a workload."""
        ...

    def refusal(self, plan: PlanT, ctx: RunContext) -> Refusal | None:
        """Why its command cannot measure this plan here, after planning; or None."""
        ...

    def measure(self, plan: PlanT, ctx: RunContext) -> StageResult:
        """Measure; metrics carry labels, findings stay empty."""
        ...

    def measure_all(self, plan: PlanT, ctx: RunContext) -> Measured:
        """Measure, with what the command shows besides the result."""
        ...

    def measured_workload(self, workload: Workload, result: StageResult) -> Workload:
        """doctor's workload with what this stage measured of it."""
        ...


class BaseStage(Generic[OptionsT, PlanT]):
    """The defaults of a `Stage`: runs anywhere, not in doctor, refuses only where
    `unavailable()` says so, measures only its result, and nothing of doctor's
    workload. A stage overrides `measure` or `measure_all`."""

    name: str = ""

    def unavailable(self) -> str | None:
        return None

    def plan(self, options: OptionsT, ctx: RunContext) -> PlanT:
        raise NotImplementedError(f"{self.name} has no command of its own")

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> PlanT:
        raise NotImplementedError(f"doctor does not run {self.name}")

    def refusal(self, plan: PlanT, ctx: RunContext) -> Refusal | None:
        why = self.unavailable()
        return None if why is None else Refusal(f"{self.name} cannot run here: {why}")

    def measure(self, plan: PlanT, ctx: RunContext) -> StageResult:
        return self.measure_all(plan, ctx).result

    def measure_all(self, plan: PlanT, ctx: RunContext) -> Measured:
        if type(self).measure is BaseStage.measure:
            raise NotImplementedError(f"{self.name}: neither measure nor measure_all")
        return Measured(self.measure(plan, ctx))

    def measured_workload(self, workload: Workload, result: StageResult) -> Workload:
        return workload


def timed(stage: Stage[OptionsT, PlanT], plan: PlanT, ctx: RunContext) -> Measured:
    """The stage measured, and how long it took: the one place a result's `duration_s`
    is set (the wall time of its measuring, planning apart), for its command and for
    doctor alike."""
    start = clocks.perf_counter()
    out = stage.measure_all(plan, ctx)
    took = round(clocks.perf_counter() - start, 3)
    return replace(out, result=replace(out.result, duration_s=took))
