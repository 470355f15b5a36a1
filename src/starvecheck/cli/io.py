"""`starvecheck io`: storage and page cache."""

from __future__ import annotations

from pathlib import Path
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
)
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.options import MOST_RUNS, MOST_SAMPLES, IoOptions, by_quick, size_text


@app.command()
def io(
    ctx: typer.Context,
    path: Annotated[
        str | None,
        typer.Argument(
            help="Directory on the storage to test (default: the working directory). "
            "starvecheck writes its data in a new directory there and removes it; with "
            "--existing, the dataset (directory or file) to sample, read-only.",
            show_default=False,
        ),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            min=1,
            max=MOST_SAMPLES,
            help=f"Samples to write and read [default: {by_quick(IoOptions.SAMPLES[False])}]. "
            "With --existing: files (or byte ranges) to read "
            f"[default: {by_quick(IoOptions.SAMPLES[True])}].",
            show_default=False,
        ),
    ] = None,
    sample_size: Annotated[
        str,
        typer.Option(
            "--sample-size",
            metavar="SIZE",
            help="Bytes per sample: 16K, 4MiB, 1.5M (binary multiples). With --existing: "
            "the byte ranges read from files over 8 MiB.",
        ),
    ] = size_text(IoOptions.sample_size),
    runs: Annotated[
        int | None,
        typer.Option(
            "--runs",
            min=1,
            max=MOST_RUNS,
            help="Measured runs per pattern, after a warm-up "
            f"[default: {by_quick(IoOptions.RUNS)}].",
            show_default=False,
        ),
    ] = None,
    threads: Annotated[
        str | None,
        typer.Option(
            "--threads",
            metavar="N[,N...]",
            help="Concurrent readers, e.g. 1,4,16 [default: 1 and the effective CPU count].",
            show_default=False,
        ),
    ] = None,
    cold: Annotated[
        bool,
        typer.Option(
            "--cold/--no-cold",
            help="Also measure with the page cache emptied (posix_fadvise, checked with mincore).",
        ),
    ] = IoOptions.cold,
    drop_caches: Annotated[
        bool,
        typer.Option(
            "--drop-caches",
            help="Before each cold run, also drop the whole machine's page cache, inodes "
            "and dentries (root only; affects every process).",
        ),
    ] = False,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave the generated data in place for inspection.")
    ] = False,
    existing: Annotated[
        bool,
        typer.Option(
            "--existing",
            help="Read a sample of the real files under PATH instead of generating data. "
            "Never writes, renames or deletes anything there.",
        ),
    ] = False,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """Storage read throughput for training data: small files vs shards, cold and warm.

    Writes the same samples as one file per sample and as one shard, then reads them
    as a shuffling loader does (small_files.random, shard.random) and as a stream
    (shard.sequential), with the page cache emptied (cold, verified with mincore)
    and full (warm), by 1 to N concurrent readers. Says which layout, how many
    readers, and what the storage itself costs.
    """
    from starvecheck.probe.machine import collect

    c = context_of(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    options = _options(
        path, samples, sample_size, runs, threads, cold, drop_caches, keep, existing, quick
    )
    # io measures this machine, never a fake sysroot: facts and figures must match.
    machine = collect(SysRoot(Path("/")), path=options.path, environ=c.environ)
    result = measure_one(options, c, out, machine).result
    return emit(build_report("io", machine, [result], c), out, c)


def _options(
    path: str | None,
    samples: int | None,
    sample_size: str,
    runs: int | None,
    threads: str | None,
    cold: bool,
    drop_caches: bool,
    keep: bool,
    existing: bool,
    quick: bool,
) -> IoOptions:
    """io's typed options from the command's values (in its signature's order), each
    string parsed and checked (one line, exit 2)."""
    size = args.sample_size(sample_size)
    target = args.data_path(path, existing)
    return IoOptions(
        path=target,
        existing=existing,
        sample_size=size,
        samples=samples,
        runs=runs,
        threads=args.counts("--threads", threads, 1, 1024) if threads is not None else None,
        cold=cold,
        drop_caches=drop_caches,
        keep=keep,
        quick=quick,
    )
