"""`starvecheck starve`: CPU preprocessing against the GPU step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from starvecheck.advice.report import build_report
from starvecheck.cli import args
from starvecheck.cli.common import (
    BatchTimeoutOpt,
    FailOn,
    FailOnOpt,
    JsonOpt,
    MarkdownOpt,
    Outputs,
    PlotOpt,
    QuickOpt,
    StepsOpt,
    WorkersOpt,
    app,
    context_of,
    emit,
    finite,
    measure_one,
)
from starvecheck.core import surroundings
from starvecheck.inputs.workload import bounds as workload_bounds
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.options import DEFAULT_WORKERS_TEXT, MOST_BATCH, StarveOptions, by_quick


@app.command()
def starve(
    ctx: typer.Context,
    sample_ms: Annotated[
        float | None,
        typer.Option(
            "--sample-ms",
            callback=finite(*workload_bounds("cpu_ms_per_sample")),  # as doctor's
            help="D: CPU milliseconds of work per sample in a worker "
            f"[default: {StarveOptions.ASSUMED_SAMPLE_MS:g}, an assumed figure: give yours].",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=MOST_BATCH, help="B: samples per batch.")
    ] = StarveOptions.batch_size,
    step_ms: Annotated[
        float | None,
        typer.Option(
            "--step-ms",
            callback=finite(0.0, 60_000.0, above=True),
            help="G: milliseconds the consumer (the GPU step) takes per batch "
            f"[default: {StarveOptions.ASSUMED_STEP_MS:g}, an assumed figure: give yours].",
            show_default=False,
        ),
    ] = None,
    workers: WorkersOpt(f"num_workers values to sweep [default: {DEFAULT_WORKERS_TEXT}].") = None,
    steps: StepsOpt(
        f"Measured steps per point, after {StarveOptions.WARMUP_STEPS} warm-up steps "
        f"[default: {by_quick(StarveOptions.STEPS)}]."
    ) = None,
    sleep: Annotated[
        bool,
        typer.Option(
            "--sleep",
            help="Samples sleep D ms instead of working: the simpler "
            "sleep-based model, for comparison.",
        ),
    ] = False,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            metavar="NAME",
            help="Real tokenization by this transformers tokenizer (a local "
            "directory or a cached name; never downloaded) instead of a busy loop.",
        ),
    ] = None,
    batch_timeout: BatchTimeoutOpt = None,
    plot: PlotOpt("GPU idle share against workers") = None,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """Is the input pipeline fast enough for the GPU? A producer/consumer run.

    Each sample costs D ms of real CPU work in a DataLoader worker, batches of B feed
    a consumer that takes G ms per step. For each num_workers: the measured wait per
    step and the GPU idle share, next to what a CPU-aware model and a sleep-based
    model predict, so you see where more workers stop helping on this machine.
    """
    from starvecheck.probe.machine import collect

    c = context_of(ctx)
    surroundings.check("torch")  # what would end the process as torch loads
    out = Outputs.check(json_path, markdown_path, fail_on, plot=plot)
    plot_path = args.plot_path(plot)
    machine = collect(SysRoot(Path("/")), environ=c.environ)
    options = _options(sample_ms, batch_size, step_ms, workers, steps, sleep, tokenizer, quick)
    result = measure_one(options, c, out, machine, batch_timeout).result
    if plot_path:
        from starvecheck.render.plot import sweep_plot

        sweep_plot(result, plot_path)
    return emit(build_report("starve", machine, [result], c), out, c)


def _options(
    sample_ms: float | None,
    batch_size: int,
    step_ms: float | None,
    workers: str | None,
    steps: int | None,
    sleep: bool,
    tokenizer: str | None,
    quick: bool,
) -> StarveOptions:
    """starve's typed options from the command's values (in its signature's order),
    --workers parsed and checked (one line, exit 2)."""
    return StarveOptions(
        sample_ms=sample_ms,
        batch_size=batch_size,
        step_ms=step_ms,
        workers=args.worker_counts(workers),
        steps=steps,
        sleep=sleep,
        tokenizer=tokenizer,
        quick=quick,
    )
