"""`env`: read-only facts about this machine. The facts travel in the report's
`machine`; advice/env.py judges them for a training job."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starvecheck.model import Caveat, StageResult
from starvecheck.probe.machine import Machine, collect
from starvecheck.probe.nvml import NvmlSource
from starvecheck.stages.base import RunContext
from starvecheck.sysroot import SysRoot


def run(
    root: SysRoot,
    *,
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    nvml: NvmlSource | None = None,
) -> tuple[Machine, StageResult]:
    start = time.perf_counter()
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
        duration_s=round(time.perf_counter() - start, 4),
    )
    return machine, result


class EnvStage:
    """`env` in the registry (stages/base.Stage). It measures nothing: its result
    carries the facts' provenance, and the facts themselves are the report's machine."""

    name = "env"

    def unavailable(self) -> str | None:
        return None

    def plan(self, options: Mapping[str, Any], ctx: RunContext) -> dict[str, Any]:
        return dict(options)

    def doctor_plan(self, workload: Any, quick: bool, ctx: RunContext) -> dict[str, Any]:
        return {"path": ctx.path}

    def measure(self, plan: Mapping[str, Any], ctx: RunContext) -> StageResult:
        root = plan.get("root") or SysRoot.from_environ(dict(ctx.environ))
        return run(root, path=plan.get("path"), environ=ctx.environ)[1]


STAGE = EnvStage()
