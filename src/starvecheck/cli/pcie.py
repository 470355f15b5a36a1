"""`starvecheck pcie`: host <-> device bandwidth, overlap, the link under load, NUMA."""

from __future__ import annotations

from typing import Annotated

import typer

from starvecheck.advice.report import build_report
from starvecheck.cli import args
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
from starvecheck.core import surroundings
from starvecheck.core.model import StageResult
from starvecheck.stages.options import MOST_RUNS, PcieOptions, by_quick, size_list


@app.command()
def pcie(
    ctx: typer.Context,
    sizes: Annotated[
        str | None,
        typer.Option(
            "--sizes",
            metavar="SIZE[,SIZE...]",
            help=f"Copy sizes [default: {size_list(PcieOptions.SIZES[False])}; "
            f"{size_list(PcieOptions.SIZES[True])} with --quick].",
            show_default=False,
        ),
    ] = None,
    runs: Annotated[
        int | None,
        typer.Option(
            "--runs",
            min=3,
            max=MOST_RUNS,
            help="Measured copies per size, after warm-up "
            f"[default: {by_quick(PcieOptions.RUNS)}].",
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

    c = context_of(ctx)
    surroundings.check("torch")  # what would end the process as torch loads
    out = Outputs.check(json_path, markdown_path, fail_on)
    options = PcieOptions(
        sizes=args.copy_sizes(sizes) if sizes is not None else None, runs=runs, quick=quick
    )
    machine = collect(sysroot_of(c), environ=c.environ)

    def refused(host_side: StageResult) -> None:
        # The host-side report first (JSON stays valid for scripts), then the one line
        # and exit 3 from cli.main: the measurement itself could not run here.
        emit(build_report("pcie", machine, [host_side], c), out, c)

    result = measure_one(options, c, out, machine, refused=refused).result
    return emit(build_report("pcie", machine, [result], c), out, c)
