"""`starvecheck env`: the machine itself."""

from __future__ import annotations

from typing import Annotated

import typer

from starvecheck.advice.report import build_report
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
    measure_one,
    sysroot_of,
)


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
    from starvecheck.stages.options import EnvOptions

    c = context_of(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    measured = measure_one(EnvOptions(root=sysroot_of(c), path=path), c, out, None)
    # The facts themselves too: they are the report's machine.
    return emit(build_report("env", measured.machine, [measured.result], c), out, c)
