"""`env`: read-only facts about this machine. The facts travel in the report's
`machine`; advice/env.py (with advice/devices.py) judges them for a training job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from starvecheck.core import surroundings
from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.status import UsageError
from starvecheck.probe.machine import Machine, collect, resolve_data_path
from starvecheck.probe.nvml import NvmlSource
from starvecheck.probe.sysroot import ENV_VAR, SysRoot
from starvecheck.stages.base import BaseStage, Measured, RunContext
from starvecheck.stages.options import EnvOptions

if TYPE_CHECKING:
    from starvecheck.inputs.workload import Workload


def run(
    root: SysRoot,
    *,
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    nvml: NvmlSource | None = None,
) -> tuple[Machine, StageResult]:
    machine = collect(root, path=path, environ=environ, nvml=nvml)
    caveats = []
    if not root.real:
        caveats.append(
            Caveat(
                "env.fake-sysroot",
                f"facts read from the fake sysroot {root.root} "
                "(STARVECHECK_SYSROOT), not from this machine",
            )
        )
    result = StageResult(
        stage="env",
        parameters={"path": machine.storage.path, "sysroot": str(root.root)},
        caveats=tuple(caveats),
    )
    return machine, result


@dataclass(frozen=True)
class Plan:
    root: SysRoot  # the machine described: / or a fake one (STARVECHECK_SYSROOT)
    path: str | None = None  # the data directory whose storage to describe (None: cwd)


class EnvStage(BaseStage[EnvOptions, Plan]):
    """`env` in the registry (stages/base.Stage). It measures nothing: its result
    carries the facts' provenance, and the facts themselves are the report's machine."""

    name = "env"

    def plan(self, options: EnvOptions, ctx: RunContext) -> Plan:
        root = options.root or SysRoot.from_environ(dict(ctx.environ))
        path = options.path
        if root.real:
            surroundings.check_relative(path, path)
        # The path is looked up on the machine described: a fake one has its own files.
        if path is not None and not root.exists(resolve_data_path(root, path)):
            where = "" if root.real else f" in {ENV_VAR}={root.root}"
            raise UsageError(f"{path}: no such file or directory{where}")
        return Plan(root, path)

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> Plan:
        # doctor measures this machine: its facts must be the figures' machine.
        return Plan(SysRoot(Path("/")), ctx.path)

    def measure_all(self, plan: Plan, ctx: RunContext) -> Measured:
        """The facts and the result about them (the `env` command reports both)."""
        machine, result = run(plan.root, path=plan.path, environ=ctx.environ)
        return Measured(result, machine=machine)


STAGE = EnvStage()
