"""`starvecheck doctor`: the whole chain against one workload, and its weakest link."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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
    TokenizerOpt,
    app,
    context_of,
    emit,
    exit_status,
    finite,
    progress_bar,
    warning,
)
from starvecheck.core import surroundings
from starvecheck.core.model import StageResult
from starvecheck.core.report import Report
from starvecheck.core.status import UsageError
from starvecheck.inputs.workload import ASSUMED_STEP_MS, Workload
from starvecheck.inputs.workload import bounds as workload_bounds
from starvecheck.stages.base import RunContext, no_progress
from starvecheck.stages.options import number, size_text

if TYPE_CHECKING:
    from starvecheck.cli.ranks import Rank
    from starvecheck.core.context import Context
    from starvecheck.probe.machine import Machine
    from starvecheck.stages.doctor.measure import Outcome

# The stages that load torch (a DataLoader; CUDA). Without --step-ms doctor loads it too,
# to look for a CUDA device to time the step on.
TORCH_STAGES = {"loader", "starve", "pcie"}


@app.command()
def doctor(
    ctx: typer.Context,
    path: Annotated[
        str | None,
        typer.Argument(
            help="Directory on the storage to test (default: the working directory). "
            "io and loader write their data in new directories there and remove them.",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            help=f"Samples per batch [default: {Workload.batch_size}].",
            show_default=False,
        ),
    ] = None,
    sample_size: Annotated[
        str | None,
        typer.Option(
            "--sample-size",
            metavar="SIZE",
            help="Bytes per sample on disk: 8K, 1MiB, ... "
            f"[default: {size_text(Workload.sample_size)}].",
            show_default=False,
        ),
    ] = None,
    context: Annotated[
        int | None,
        typer.Option(
            "--context",
            "--seq-len",
            help=f"Context length (max_length) in tokens [default: {Workload.context}].",
            show_default=False,
        ),
    ] = None,
    cpu_ms_per_sample: Annotated[
        float | None,
        typer.Option(
            "--cpu-ms-per-sample",
            callback=finite(*workload_bounds("cpu_ms_per_sample")),
            help="CPU milliseconds of preprocessing per sample in a worker "
            f"[default: {number(Workload.cpu_ms_per_sample)}].",
            show_default=False,
        ),
    ] = None,
    tokenizer: TokenizerOpt(
        "transformers tokenizer (a local directory or a cached name; never "
        "downloaded): measures the CPU cost per sample by real tokenization, and "
        "counts tokens of --dataset."
    ) = None,
    step_ms: Annotated[
        float | None,
        typer.Option(
            "--step-ms",
            callback=finite(*workload_bounds("step_ms")),
            help="GPU milliseconds per training step [default: measured with GPT-2 on a "
            f"CUDA device; {number(ASSUMED_STEP_MS)}, assumed, without one].",
            show_default=False,
        ),
    ] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            "--layout",
            metavar="shard|small_files",
            help="How the data is stored: one shard file, or one file per sample "
            f"[default: {Workload.layout}].",
            show_default=False,
        ),
    ] = None,
    current: Annotated[
        str | None,
        typer.Option(
            "--current",
            metavar="STRATEGY",
            help="The batching strategy trained with today (as pad's --current) "
            f"[default: {Workload.current}].",
            show_default=False,
        ),
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset",
            metavar="PATH",
            help="Dataset for pad to measure (else its embedded Alpaca-like default).",
            show_default=False,
        ),
    ] = None,
    factory: Annotated[
        str | None,
        typer.Option(
            "--factory",
            metavar="FILE.py:FUNC",
            help="The loader link measured on your own pipeline: FUNC() returns a Dataset "
            "or DataLoader (as `loader --factory`), instead of generated data.",
            show_default=False,
        ),
    ] = None,
    field: Annotated[
        list[str] | None,
        typer.Option(
            "--field", metavar="NAME", help="Field of --dataset holding the sample (as pad's)."
        ),
    ] = None,
    workload_file: Annotated[
        str | None,
        typer.Option(
            "--workload",
            metavar="FILE.toml",
            help="The workload from a TOML file with the same keys (batch_size, "
            "sample_size, context, cpu_ms_per_sample, step_ms, layout, current, dataset, "
            "field, tokenizer, factory); options override it.",
            show_default=False,
        ),
    ] = None,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            metavar="STAGE[,STAGE...]",
            help="Run only these of io, loader, starve, pad, pcie (env always runs).",
            show_default=False,
        ),
    ] = None,
    skip: Annotated[
        str | None,
        typer.Option(
            "--skip",
            metavar="STAGE[,STAGE...]",
            help="Run all stages but these.",
            show_default=False,
        ),
    ] = None,
    batch_timeout: BatchTimeoutOpt = None,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
    plot: PlotOpt("the chain: each link's capacity against the GPU's demand") = None,
) -> int:
    """The whole chain against one workload: each link's capacity, the weakest, what to fix.

    Runs env, io, loader, starve, pad and (with a CUDA device) pcie against one workload
    (batch size, bytes per sample, context, CPU per sample, GPU step time), states each
    link's capacity in samples per second next to what the GPU consumes, names the
    weakest link and how much faster training would run with it fixed, and ranks every
    stage's findings in one checklist. Under torchrun, every rank measures its own node
    and rank 0 reports them all, with stragglers (the other ranks write nothing).
    For a training job that is already running, `starvecheck attach PID` reads it
    instead, in seconds, without a restart.
    """
    from starvecheck.cli import ranks as doctor_ranks
    from starvecheck.stages.doctor import measure as doctor_stage

    c = context_of(ctx)
    plot_path = args.plot_path(plot)
    stages = doctor_stage.select(only, skip)
    w = _workload(
        workload_file, batch_size, sample_size, context, cpu_ms_per_sample, step_ms, layout,
        current, dataset, field, tokenizer, factory,
    )  # fmt: skip
    out = _outputs(w, workload_file, stages, json_path, markdown_path, fail_on, plot)
    if w.step_ms is None or set(stages) & TORCH_STAGES:
        # Before PATH is looked at: what would end the process as torch loads.
        surroundings.check("torch")
    rank = doctor_ranks.from_environ(c.environ)
    machine, results, outcome = _measure(c, out, w, stages, path, rank, batch_timeout, quick)
    report, shown = _judged(c, machine, results, outcome, rank)
    if not shown:  # not rank 0: nothing on stdout, the same exit status
        return exit_status(report, out.fail_on)
    if plot_path:
        from starvecheck.render.plot import chain_plot

        chain_plot(report, plot_path)
    return emit(report, out, c)


def _workload(
    workload_file: str | None,
    batch_size: int | None,
    sample_size: str | None,
    context: int | None,
    cpu_ms_per_sample: float | None,
    step_ms: float | None,
    layout: str | None,
    current: str | None,
    dataset: str | None,
    field: list[str] | None,
    tokenizer: str | None,
    factory: str | None,
) -> Workload:
    """The workload: the defaults, then --workload's file, then the options given (the
    command's values, in its signature's order), each checked (one line, exit 2)."""
    from starvecheck.inputs.workload import check, read_file, resolve

    given: dict[str, Any] = {}
    for key, option, value in (
        ("batch_size", "--batch-size", batch_size),
        ("sample_size", "--sample-size", sample_size),
        ("context", "--context", context),
        ("cpu_ms_per_sample", "--cpu-ms-per-sample", cpu_ms_per_sample),
        ("step_ms", "--step-ms", step_ms),
        ("layout", "--layout", layout),
        ("current", "--current", current),
        ("dataset", "--dataset", dataset),
        ("field", "--field", field or None),
        ("tokenizer", "--tokenizer", tokenizer),
        ("factory", "--factory", factory),
    ):
        if value is not None:
            given[key] = check(key, value, option)
    from_file = read_file(workload_file) if workload_file is not None else {}
    w = resolve(from_file, given)
    if w.field and not w.dataset:
        raise UsageError("--field applies to --dataset")
    return w


def _outputs(
    w: Workload,
    workload_file: str | None,
    stages: tuple[str, ...],
    json_path: str | None,
    markdown_path: str | None,
    fail_on: FailOn,
    plot: str | None,
) -> Outputs:
    """The outputs, checked against each other and against the files the workload
    reads; the dataset pad will read, refused now if unreadable, not after the other
    stages."""
    from starvecheck.inputs import files as inputs

    from_option = w.source("dataset") == "option"
    out = Outputs.check(
        json_path,
        markdown_path,
        fail_on,
        plot=plot,
        inputs=[
            ("--workload", workload_file),
            ("--dataset" if from_option else "the workload's dataset", w.dataset),
            ("--factory", w.factory.path if w.factory else None),
        ],
    )
    if w.dataset is not None and "pad" in stages:
        where = "--dataset" if from_option else f"--workload {workload_file}: dataset"
        inputs.check(w.dataset, f"{where} {w.dataset}")
    return out


def _measure(
    c: Context,
    out: Outputs,
    w: Workload,
    stages: tuple[str, ...],
    path: str | None,
    rank: Rank | None,
    batch_timeout: float | None,
    quick: bool,
) -> tuple[Machine, list[StageResult], Outcome]:
    """This machine's facts (env), then every selected stage against the workload:
    the machine, every result (env's first) and doctor's outcome."""
    from starvecheck.cli import ranks as doctor_ranks
    from starvecheck.probe.sysroot import SysRoot
    from starvecheck.stages import env as env_stage
    from starvecheck.stages.doctor import measure as doctor_stage

    needs_disk = any(s in stages for s in ("io", "loader"))
    # Without io and loader nothing is written there: PATH is only read (its storage).
    target = args.data_path(path, not needs_disk, "doctor") if needs_disk or path else None
    root = SysRoot(Path("/"))  # doctor measures this machine: facts and figures must match
    machine, env_result = env_stage.run(root, path=target, environ=c.environ)
    # Under torchrun only rank 0 draws a progress bar (the ranks share the terminal).
    quiet = rank is not None and rank.rank != 0
    with nullcontext(no_progress) if quiet else progress_bar(c, out) as progress:
        run_ctx = RunContext(
            machine=machine,
            environ=c.environ,
            progress=progress,
            warn=lambda msg: warning(c, msg),
            path=target or (None if surroundings.cwd_removed() else os.getcwd()),
            slow_ms=doctor_ranks.slow_ms(c.environ, rank.rank if rank else 0),
        )
        if batch_timeout is not None:
            run_ctx = replace(run_ctx, batch_timeout_s=batch_timeout)
        outcome = doctor_stage.run(w, stages, quick, run_ctx)
    return machine, [env_result, *outcome.results], outcome


def _judged(
    c: Context,
    machine: Machine,
    results: list[StageResult],
    outcome: Outcome,
    rank: Rank | None,
) -> tuple[Report, bool]:
    """The report, judged once, and whether this process shows it. Under torchrun,
    rank 0 shows every node's, judged again with the stragglers across them; the other
    ranks show nothing, and exit as their own report says."""
    from starvecheck.cli import ranks as doctor_ranks
    from starvecheck.stages.doctor import measure as doctor_stage

    def report_of(results: list[StageResult], **more: Any) -> Report:
        return build_report("doctor", machine, results, c, workload=outcome.workload, **more)

    report = report_of(results, doctor=outcome.context)
    if rank is None:
        return report, True
    gathered = doctor_ranks.gather(report, rank, c.environ)
    if gathered is None:
        return report, False
    nodes, findings, caveats = doctor_ranks.judge(gathered, outcome.workload.demand)
    results = doctor_stage.with_caveats(results, caveats)
    context = replace(outcome.context, findings=tuple(findings))
    return report_of(results, doctor=context, nodes=nodes), True
