"""`starvecheck pcie`: host <-> device bandwidth, overlap, the link under load, NUMA."""

from __future__ import annotations

from typing import Annotated

import typer

from starvecheck import args
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
from starvecheck.report import build_report
from starvecheck.status import Unavailable


@app.command()
def pcie(
    ctx: typer.Context,
    sizes: Annotated[
        str | None,
        typer.Option(
            "--sizes",
            metavar="SIZE[,SIZE...]",
            help="Copy sizes [default: 64K,1M,16M,256M,1G; 1M,16M,256M with --quick].",
            show_default=False,
        ),
    ] = None,
    runs: Annotated[
        int | None,
        typer.Option(
            "--runs",
            min=3,
            max=1000,
            help="Measured copies per size, after warm-up [default: 10; 5 with --quick].",
            show_default=False,
        ),
    ] = None,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """Do batches cross the bus as fast as the hardware allows, with the CPU free?

    Host <-> device copies per size, pinned and pageable, timed by CUDA events and by
    the wall clock; the same copy through the CUDA runtime as a reference; CPU work
    overlapped with the copy; the PCIe generation and width read while a copy runs;
    the NUMA penalty. Without a CUDA device: the host-side facts, then exit 3.
    """
    from starvecheck.probe.machine import collect
    from starvecheck.stages import pcie as pcie_stage
    from starvecheck.stages import registry
    from starvecheck.stages.base import RunContext

    c = context_of(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    options = {
        "sizes": args.copy_sizes(sizes) if sizes is not None else None,
        "runs": runs,
        "quick": quick,
    }
    machine = collect(sysroot_of(c), environ=c.environ)
    stage = registry.get("pcie")
    plan = stage.plan(options, RunContext(machine=machine, environ=c.environ))
    reason = stage.unavailable()
    message = f"pcie needs a CUDA device: {reason}"
    if reason is None and not machine.real:
        # Binding to a fake machine's NUMA nodes, or judging this GPU by another's link,
        # would mix two machines in one report.
        reason = f"STARVECHECK_SYSROOT={machine.sysroot} describes another machine"
        message = f"pcie measures this machine's GPU: {reason}; unset it to measure"
    if reason is not None:
        # The host-side report first (JSON stays valid for scripts), then the one line
        # and exit 3 from cli.main: the measurement itself could not run here.
        result = pcie_stage.cpu_side(machine, reason=reason, plan=plan)
        emit(build_report("pcie", machine, [result], c), out, c)
        raise Unavailable(message)
    result = measure_one("pcie", options, c, out, machine)
    return emit(build_report("pcie", machine, [result], c), out, c)
