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
from starvecheck.core.status import UsageError
from starvecheck.inputs.factory import FactorySpec
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.options import FactoryOptions, LoaderOptions, by_quick, size_text


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
    workers: WorkersOpt(
        "num_workers values to sweep [default: 0, 1, 2, 4, ... up to twice the "
        "effective CPUs, at least 4]."
    ) = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            min=1,
            max=100_000,
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
    factory_timeout: Annotated[
        float,
        typer.Option(
            "--factory-timeout",
            metavar="SECONDS",
            callback=finite(1.0, 86_400.0),
            help="With --factory: the most that importing FILE and calling FUNC may take.",
        ),
    ] = FactoryOptions.factory_timeout_s,
    step_ms: Annotated[
        float | None,
        typer.Option(
            "--step-ms",
            metavar="MS",
            callback=finite(0.001, 600_000.0, above=True),
            help="With --factory: your GPU's time per training step, from your logs: the "
            "loader is judged against the samples/s it consumes (batch size / step).",
            show_default=False,
        ),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option(
            "--budget",
            metavar="SECONDS",
            callback=finite(0.5, 3_600.0),
            help="With --factory: the seconds each configuration is read for, over its "
            "rounds (every configuration is read in turn, round after round) [default: "
            f"{FactoryOptions.BUDGET_S[False]:g}; {FactoryOptions.BUDGET_S[True]:g} with --quick].",
            show_default=False,
        ),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            min=1,
            max=10_000_000,
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
            max=1000,
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
    spec = args.factory_spec(factory)
    inputs = [("--factory", spec.path if spec else None)]
    out = Outputs.check(json_path, markdown_path, fail_on, plot=plot, inputs=inputs)
    size = args.sample_size(sample_size)
    sweep = args.worker_counts(workers)
    plot_path = args.plot_path(plot)
    options: LoaderOptions | FactoryOptions
    if spec is not None:
        target, options = _factory_options(
            spec, path, sweep, batch_size, factory_timeout, step_ms, budget, samples,
            sample_size, prefetch_factor, pin_memory, runs, existing, quick,
        )  # fmt: skip
    else:
        target, options = _loader_options(
            path, sweep, batch_size, step_ms, budget, samples, size, prefetch_factor,
            pin_memory, runs, cold, existing, quick,
        )  # fmt: skip
    machine = collect(SysRoot(Path("/")), path=target, environ=c.environ)
    result = measure_one(options, c, out, machine, batch_timeout).result
    if plot_path:
        from starvecheck.render.plot import loader_plot

        loader_plot(result, plot_path)
    return emit(build_report("loader", machine, [result], c), out, c)


def _factory_options(
    spec: FactorySpec,
    path: str | None,
    sweep: tuple[int, ...] | None,
    batch_size: int | None,
    factory_timeout: float,
    step_ms: float | None,
    budget: float | None,
    samples: int | None,
    sample_size: str,
    prefetch_factor: int,
    pin_memory: bool | None,
    runs: int,
    existing: bool,
    quick: bool,
) -> tuple[str, FactoryOptions]:
    """(the directory checked, the options) of `loader --factory`, from the command's
    values in its signature's order: the options that shape generated data are
    refused, the first one given named (one line, exit 2)."""
    args.factory_alone(
        path=path,
        sample_size=sample_size != size_text(LoaderOptions.sample_size),
        samples=samples,
        runs=runs != LoaderOptions.runs,
        prefetch_factor=prefetch_factor != LoaderOptions.prefetch_factor,
        pin_memory=pin_memory,
        existing=existing,
    )
    target = args.data_path(path, True, "loader")
    options = FactoryOptions(
        spec=spec,
        batch_size=batch_size,
        workers=sweep,
        quick=quick,
        factory_timeout_s=factory_timeout,
        budget_s=budget,
        step_ms=step_ms,
    )
    return target, options


def _loader_options(
    path: str | None,
    sweep: tuple[int, ...] | None,
    batch_size: int | None,
    step_ms: float | None,
    budget: float | None,
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
    order: --budget and --step-ms, which apply with --factory only, refused."""
    if budget is not None or step_ms is not None:
        which = "--budget" if budget is not None else "--step-ms"
        raise UsageError(f"{which} applies with --factory only")
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
