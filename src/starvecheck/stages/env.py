"""`env`: read-only facts about this machine, judged for a training job."""

from __future__ import annotations

import time
from collections.abc import Mapping

from starvecheck.advice.env import advise
from starvecheck.model import StageResult
from starvecheck.probe.machine import Machine, collect
from starvecheck.probe.nvml import NvmlSource
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
            f"facts read from the fake sysroot {root.root} "
            "(STARVECHECK_SYSROOT), not from this machine"
        )
    result = StageResult(
        stage="env",
        parameters={"path": machine.storage.path, "sysroot": str(root.root)},
        findings=advise(machine),
        caveats=tuple(caveats),
        duration_s=round(time.perf_counter() - start, 4),
    )
    return machine, result
