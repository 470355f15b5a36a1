"""`starvecheck loader`: samples/s through a real DataLoader."""

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
    WorkersOpt,
    app,
    context_of,
    emit,
    finite,
    measure_one,
)
from starvecheck.cli.modes import Mode, fence
from starvecheck.core import surroundings
from starvecheck.inputs.workload import bounds as workload_bounds
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.options import (
    DEFAULT_WORKERS_TEXT,
    MOST_BATCH,
    MOST_RUNS,
    MOST_SAMPLES,
    MOST_SECONDS,
    FactoryOptions,
    LoaderOptions,
    by_quick,
    size_text,
)

# Options that shape the data starvecheck generates: refused with --factory, with why.
_OWN_DATA = {
    "--runs": "--runs (each configuration is read until stable: --budget)",
    "--prefetch-factor": "--prefetch-factor (swept from the DataLoader's own)",
    "--pin-memory": "--pin-memory (swept where CUDA is present)",
    "--no-pin-memory": "--no-pin-memory (swept where CUDA is present)",
}
_EITHER = {"workers", "batch_size", "batch_timeout", "plot"}
# `loader --factory F:f`: the user's pipeline, which reads its own data.
FACTORY = Mode(
    frozenset({"factory", "factory_timeout_s", "step_ms", "budget_s", *_EITHER}),
    lambda given: (
        f"{_OWN_DATA.get(given[0], given[0])} does not apply with --factory: "
        "your pipeline reads its own data"
    ),
)
# `loader [PATH]`: data starvecheck writes (or, with --existing, the files under PATH).
GENERATED = Mode(
    frozenset(
        {"path", "samples", "sample_size", "prefetch_factor", "pin_memory", "runs", "cold"}
        | {"existing", *_EITHER}
    ),
    lambda given: f"{given[0]} applies with --factory only",
)


@app.command()
def loader(
    ctx: typer.Context,
    path: Annotated[
        str | None,
        typer.Argument(
            help="Directory on the storage to test (default: the working directory). "
            "starvecheck writes its data in a new directory there and removes it; with "
            "--existing, the dataset to sample, read-only.",
            show_default=False,
        ),
    ] = None,
    workers: WorkersOpt(f"num_workers values to sweep [default: {DEFAULT_WORKERS_TEXT}].") = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            min=1,
            max=MOST_BATCH,
            help=f"Samples per batch [default: {LoaderOptions.BATCH_SIZE}; with --factory, "
            "the DataLoader's own].",
            show_default=False,
        ),
    ] = None,
    factory: Annotated[
        str | None,
        typer.Option(
            "--factory",
            metavar="FILE.py:FUNC",
            help="Measure your own pipeline: FUNC() (in FILE.py, or package.module:FUNC "
            "importable from here) returns a Dataset, IterableDataset or DataLoader. "
            "num_workers, prefetch_factor, persistent_workers and pin_memory are swept "
            "against the DataLoader's current settings.",
            show_default=False,
        ),
    ] = None,
    factory_timeout_s: Annotated[
        float,
        typer.Option(
            "--factory-timeout",
            metavar="SECONDS",
            callback=finite(1.0, MOST_SECONDS),
            help="With --factory: the most that importing FILE and calling FUNC may take.",
        ),
    ] = FactoryOptions.factory_timeout_s,
    step_ms: Annotated[
        float | None,
        typer.Option(
            "--step-ms",
            metavar="MS",
            callback=finite(*workload_bounds("step_ms"), above=True),  # as doctor's
            help="With --factory: your GPU's time per training step, from your logs: the "
            "loader is judged against the samples/s it consumes (batch size / step).",
            show_default=False,
        ),
    ] = None,
    budget_s: Annotated[
        float | None,
        typer.Option(
            "--budget",
            metavar="SECONDS",
            callback=finite(0.5, 3_600.0),
            help="With --factory: the seconds each configuration is read for, over its "
            "rounds (every configuration is read in turn, round after round) "
            f"[default: {by_quick(FactoryOptions.BUDGET_S)}].",
            show_default=False,
        ),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            min=1,
            max=MOST_SAMPLES,
            help="Samples to write and read per epoch "
            f"[default: {by_quick(LoaderOptions.SAMPLES[False])}]. "
            f"With --existing: files to read [default: {by_quick(LoaderOptions.SAMPLES[True])}].",
            show_default=False,
        ),
    ] = None,
    sample_size: Annotated[
        str,
        typer.Option(
            "--sample-size", metavar="SIZE", help="Bytes per sample: 16K, 1MiB, 1.5M, ..."
        ),
    ] = size_text(LoaderOptions.sample_size),
    prefetch_factor: Annotated[
        int,
        typer.Option("--prefetch-factor", min=1, max=1024, help="Batches each worker loads ahead."),
    ] = LoaderOptions.prefetch_factor,
    pin_memory: Annotated[
        bool | None,
        typer.Option(
            "--pin-memory/--no-pin-memory",
            help="Pin batches in page-locked memory [default: when a CUDA device is present].",
            show_default=False,
        ),
    ] = None,
    runs: Annotated[
        int,
        typer.Option(
            "--runs",
            min=1,
            max=MOST_RUNS,
            help="Epochs per layout, cache state and worker count "
            f"[default: {LoaderOptions.runs}].",
            show_default=False,
        ),
    ] = LoaderOptions.runs,
    cold: Annotated[
        bool,
        typer.Option(
            "--cold/--no-cold",
            help="Also measure with the page cache emptied (posix_fadvise, checked with mincore).",
        ),
    ] = LoaderOptions.cold,
    existing: Annotated[
        bool,
        typer.Option(
            "--existing",
            help="Read a sample of the real files under PATH, one file per sample, instead "
            "of generating data. Never writes, renames or deletes anything there.",
        ),
    ] = False,
    batch_timeout: BatchTimeoutOpt = None,
    plot: PlotOpt("samples/s against num_workers per layout") = None,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """Samples per second through a real DataLoader: layouts, num_workers, cold and warm.

    The same samples as one file per sample, one indexed shard and MosaicML Streaming
    MDS shards, each read through torch.utils.data.DataLoader with shuffling, for
    num_workers 0, 1, 2, 4, ...: samples/s, MB/s, time to the first batch, wait per
    batch. Recommends the fewest workers that reach 95% of the best throughput.
    """
    from starvecheck.probe.machine import collect

    c = context_of(ctx)
    # Before PATH or FILE is looked at: what would end the process as torch loads.
    surroundings.check("torch")
    spec = args.factory_spec(factory)
    fence(ctx, FACTORY if spec is not None else GENERATED)
    inputs = [("--factory", spec.path if spec else None)]
    out = Outputs.check(json_path, markdown_path, fail_on, plot=plot, inputs=inputs)
    size = args.sample_size(sample_size)
    sweep = args.worker_counts(workers)
    plot_path = args.plot_path(plot)
    options: LoaderOptions | FactoryOptions
    if spec is not None:
        target = args.data_path(path, True, "loader")
        options = FactoryOptions(
            spec=spec,
            batch_size=batch_size,
            workers=sweep,
            quick=quick,
            factory_timeout_s=factory_timeout_s,
            budget_s=budget_s,
            step_ms=step_ms,
        )
    else:
        target, options = _loader_options(
            path, sweep, batch_size, samples, size, prefetch_factor, pin_memory, runs, cold,
            existing, quick,
        )  # fmt: skip
    machine = collect(SysRoot(Path("/")), path=target, environ=c.environ)
    result = measure_one(options, c, out, machine, batch_timeout).result
    if plot_path:
        from starvecheck.render.plot import loader_plot

        loader_plot(result, plot_path)
    return emit(build_report("loader", machine, [result], c), out, c)


def _loader_options(
    path: str | None,
    sweep: tuple[int, ...] | None,
    batch_size: int | None,
    samples: int | None,
    size: int,
    prefetch_factor: int,
    pin_memory: bool | None,
    runs: int,
    cold: bool,
    existing: bool,
    quick: bool,
) -> tuple[str, LoaderOptions]:
    """(the directory checked, the options) of `loader` on generated data (or, with
    --existing, the files under PATH), from the command's values in its signature's
    order."""
    target = args.data_path(path, existing, "loader")
    options = LoaderOptions(
        path=target,
        existing=existing,
        sample_size=size,
        samples=samples,
        workers=sweep,
        runs=runs,
        batch_size=batch_size,
        prefetch_factor=prefetch_factor,
        pin_memory=pin_memory,
        cold=cold,
        quick=quick,
    )
    return target, options
