"""`starvecheck attach PID`: a training job that is already running, read without
touching it."""

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
    finite,
    measure_one,
    sysroot_of,
)
from starvecheck.stages.options import MOST_SECONDS, AttachOptions, by_quick


@app.command()
def attach(
    ctx: typer.Context,
    pid: Annotated[
        int,
        typer.Argument(help="The training process (or its torchrun agent).", show_default=False),
    ],
    seconds: Annotated[
        float | None,
        typer.Option(
            "--duration",
            # click's own range lets nan through
            callback=finite(AttachOptions.MIN_SECONDS, AttachOptions.MAX_SECONDS),
            metavar="SECONDS",
            help=f"How long to sample [default: {by_quick(AttachOptions.SECONDS)}].",
            show_default=False,
        ),
    ] = None,
    rate: Annotated[
        int,
        typer.Option(
            "--rate",
            min=1,
            max=AttachOptions.RATE_CEILING,
            help=f"Stack samples a second per process (at most {AttachOptions.RATE_CEILING}).",
        ),
    ] = AttachOptions.rate,
    all_ranks: Annotated[
        bool, typer.Option("--all", help="Every rank on this node beside PID.")
    ] = AttachOptions.all_ranks,
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            callback=finite(1.0, MOST_SECONDS),
            metavar="SECONDS",
            help="Read a window every SECONDS until the job ends; the last is the report.",
            show_default=False,
        ),
    ] = None,
    prometheus: Annotated[
        int | None,
        typer.Option(
            "--prometheus",
            min=0,
            max=65535,
            metavar="PORT",
            help="With --every: serve each window's figures for Prometheus on PORT.",
            show_default=False,
        ),
    ] = None,
    prometheus_addr: Annotated[
        str, typer.Option("--prometheus-addr", metavar="ADDR", help="The address to serve on.")
    ] = "127.0.0.1",
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """Why is this running job's GPU waiting? Read it for some seconds, untouched.

    Samples the Python stacks of the training process and its DataLoader workers
    with py-spy, never pausing them (non-blocking), while reading /proc and the
    cgroup: the share of time the loop waits for data, what the workers spend it on
    (reading, decoding, tokenizing, collating, handing batches over), their CPU,
    memory and reads, throttling. Where stacks may not be read, says what is missing
    and reports the rest. A torchrun agent's PID (or --all) reads every rank.
    """
    from starvecheck.cli import windows
    from starvecheck.probe.machine import collect

    c = context_of(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    options = AttachOptions(pid, seconds, rate, all_ranks, quick)
    windows.check(every, prometheus, options.window_s)
    machine = collect(sysroot_of(c), environ=c.environ)
    if every is not None:  # a sidecar: a window every SECONDS (cli/windows.py)
        return windows.windows(options, c, out, machine, every, prometheus, prometheus_addr)
    result = measure_one(options, c, out, machine).result
    return emit(build_report("attach", machine, [result], c), out, c)
