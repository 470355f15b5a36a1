"""`starvecheck env`: the machine itself."""

from __future__ import annotations

from typing import Annotated

import typer

from starvecheck.cli.common import (
    FailOn,
    FailOnOpt,
    JsonOpt,
    MarkdownOpt,
    Outputs,
    QuickOpt,
    app,
    context_of,
    emit,
    sysroot_of,
    warning,
)
from starvecheck.report import build_report


@app.command()
def env(
    ctx: typer.Context,
    path: Annotated[
        str | None,
        typer.Argument(
            help="Data directory whose storage to describe (default: the working directory).",
            show_default=False,
        ),
    ] = None,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """Facts about this machine that decide how fast data can reach the GPU.

    CPU quota and affinity, throttling, memory and /dev/shm, locked-memory and
    open-file limits, NUMA, GPUs and their PCIe links, container, storage and
    library versions, each with what it means for a DataLoader. Reads only;
    --quick changes nothing (env is always quick).
    """
    from starvecheck.stages import registry
    from starvecheck.stages.base import RunContext

    c = context_of(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    stage = registry.get("env")
    run_ctx = RunContext(environ=c.environ, warn=lambda msg: warning(c, msg))
    plan = stage.plan({"root": sysroot_of(c), "path": path}, run_ctx)
    # The facts themselves too: they are the report's machine.
    machine, result = stage.measure_facts(plan, run_ctx)  # type: ignore[attr-defined]
    return emit(build_report("env", machine, [result], c), out, c)
