"""`starvecheck pad`: the padding tax of a dataset."""

from __future__ import annotations

from enum import Enum
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
    PlotOpt,
    QuickOpt,
    TokenizerOpt,
    app,
    context_of,
    emit,
    measure_one,
)
from starvecheck.core import surroundings
from starvecheck.core.context import Context
from starvecheck.core.strategies import STRATEGIES
from starvecheck.inputs.workload import bounds as workload_bounds
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.options import PadOptions


class DataFormat(str, Enum):
    auto = "auto"
    jsonl = "jsonl"
    json = "json"
    parquet = "parquet"
    csv = "csv"
    tsv = "tsv"
    text = "text"


# --current's choices; the ids live in one place, core/strategies.py (no numpy there).
Strategy = Enum("Strategy", {s: s for s in STRATEGIES}, type=str)  # type: ignore[misc]
DEFAULT_STRATEGY = Strategy(PadOptions.current)


@app.command()
def pad(
    ctx: typer.Context,
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset",
            metavar="PATH",
            help="Dataset file to measure: JSON Lines, JSON, Parquet, CSV/TSV or plain text "
            "(one sample per line); .gz is read as it is.",
            show_default=False,
        ),
    ] = None,
    fields: Annotated[
        list[str] | None,
        typer.Option(
            "--field",
            metavar="NAME",
            help="Field holding the sample: text, token ids or chat messages [default: text]. "
            "Repeat (or separate with commas) to join several with a newline, e.g. "
            "--field instruction,input,output.",
            show_default=False,
        ),
    ] = None,
    format: Annotated[
        DataFormat,
        typer.Option("--format", case_sensitive=False, help="Dataset format (auto: by suffix)."),
    ] = DataFormat.auto,
    tokenizer: TokenizerOpt(
        "transformers tokenizer to count tokens with: a local directory or a "
        "cached name; never downloaded."
    ) = None,
    lengths: Annotated[
        str | None,
        typer.Option(
            "--lengths",
            metavar="PATH",
            help="File of token lengths, one per line ('-' for stdin), instead of --dataset.",
            show_default=False,
        ),
    ] = None,
    context: Annotated[
        int,
        typer.Option(
            "--context",
            min=int(workload_bounds("context")[0]),  # as doctor's
            max=int(workload_bounds("context")[1]),
            help="Context length (max_length) in tokens.",
        ),
    ] = PadOptions.context,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            min=int(workload_bounds("batch_size")[0]),  # as doctor's
            max=int(workload_bounds("batch_size")[1]),
            help="Samples per batch; rows of --context tokens per batch when packing.",
        ),
    ] = PadOptions.batch_size,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=1,
            max=1_000_000_000,
            help=f"Measure the first N samples [default: all; {PadOptions.QUICK_LIMIT:,} with "
            "--quick; the embedded default has 2,000].",
            show_default=False,
        ),
    ] = None,
    current: Annotated[
        Strategy,
        typer.Option(
            "--current",
            case_sensitive=False,
            help="The strategy you train with today; gains are counted against it.",
        ),
    ] = DEFAULT_STRATEGY,
    seed: Annotated[
        int,
        typer.Option("--seed", min=0, max=2**32 - 1, help="Seed of the shuffles."),
    ] = PadOptions.seed,
    plot: PlotOpt("a typical batch per strategy, as a heatmap") = None,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """How much of each step is padding? Every common batching strategy on your data.

    Token lengths from --dataset (tokenized here with --tokenizer), --lengths, or an
    embedded Alpaca-like default. For each strategy (pad to context, dynamic padding,
    pad_to_multiple_of, length grouping, padding-free, greedy and bin packing): the
    share of computed positions that are real tokens, positions per batch, batches
    per epoch and attention work, and the gain over the strategy you use today.
    """
    from starvecheck.probe.machine import collect

    c = context_of(ctx)
    surroundings.check("numpy")  # pad counts in numpy: too small a ulimit -v ends its import
    inputs = [("--dataset", dataset), ("--lengths", lengths)]
    out = Outputs.check(json_path, markdown_path, fail_on, plot=plot, inputs=inputs)
    options = _options(
        c, dataset, fields, format, tokenizer, lengths, context, batch_size, limit,
        current, seed, quick,
    )  # fmt: skip
    plot_path = args.plot_path(plot)
    # The layouts behind the figures too: --plot draws a batch of each.
    measured = measure_one(options, c, out, None)
    if plot_path and measured.pad_run is not None:
        from starvecheck.render.plot import pad_plot

        pad_plot(measured.pad_run, plot_path)
    machine = collect(SysRoot(Path("/")), environ=c.environ)
    return emit(build_report("pad", machine, [measured.result], c), out, c)


def _options(
    c: Context,
    dataset: str | None,
    fields: list[str] | None,
    format: DataFormat,
    tokenizer: str | None,
    lengths: str | None,
    context: int,
    batch_size: int,
    limit: int | None,
    current: Strategy,
    seed: int,
    quick: bool,
) -> PadOptions:
    """pad's typed options from the command's values (in its signature's order),
    --field parsed and checked (one line, exit 2); --lengths - reads `c`'s stdin."""
    return PadOptions(
        context=context,
        batch_size=batch_size,
        current=current.value,
        seed=seed,
        limit=limit,
        dataset=dataset,
        format=None if format is DataFormat.auto else format.value,
        fields=args.fields(fields),
        tokenizer=tokenizer,
        lengths=lengths,
        stdin=c.stdin,
        quick=quick,
    )
