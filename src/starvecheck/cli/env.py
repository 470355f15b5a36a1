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
    build_report,
    context_of,
    emit,
    sysroot_of,
)
from starvecheck.status import UsageError
from starvecheck.sysroot import ENV_VAR


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
    from starvecheck.probe.machine import resolve_data_path
    from starvecheck.stages import env as env_stage

    c = context_of(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    root = sysroot_of(c)
    if path is not None and not root.exists(resolve_data_path(root, path)):
        where = "" if root.real else f" in {ENV_VAR}={root.root}"
        raise UsageError(f"{path}: no such file or directory{where}")
    machine, result = env_stage.run(root, path=path, environ=c.environ)
    return emit(build_report("env", machine, [result], c), out, c)
