"""`starvecheck profile`: a training loop under torch.profiler, or a trace."""

from __future__ import annotations

from enum import Enum
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
    QuickOpt,
    StepsOpt,
    TokenizerOpt,
    WorkersOpt,
    app,
    context_of,
    emit,
    finite,
    measure_one,
)
from starvecheck.cli.modes import Mode, fence
from starvecheck.core import surroundings
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.options import (
    MOST_SECONDS,
    ProfileOptions,
    TraceOptions,
    by_quick,
    size_text,
)


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class ModelSize(str, Enum):
    auto = "auto"
    tiny = "tiny"
    small = "small"
    base = "base"


_TRACE_ONLY = {"trace", "max_bytes", "max_seconds"}
# `profile --trace`: traces another run left; no loop runs, so none of its options apply.
TRACES = Mode(
    frozenset(_TRACE_ONLY),
    lambda given: (
        f"--trace reads traces and runs no loop: drop {', '.join(given)}"
        + (" (several traces: repeat --trace, or name their directory)" if "PATH" in given else "")
    ),
)
# `profile [PATH]`: starvecheck's own loop.
LOOP = Mode(
    frozenset({"path", "workers", "steps", "model_size", "device", "cold", "trace_dir"})
    | {"tokenizer", "batch_timeout"},
    lambda given: f"{given[0]} applies with --trace",
)


@app.command()
def profile(
    ctx: typer.Context,
    path: Annotated[
        str | None,
        typer.Argument(
            help="Directory on the storage to train from (default: the working directory). "
            "starvecheck writes its token data in a new directory there and removes it.",
            show_default=False,
        ),
    ] = None,
    workers: WorkersOpt(
        "num_workers values [default: 0 and the effective CPUs, at most "
        f"{ProfileOptions.MAX_DEFAULT_WORKERS}]."
    ) = None,
    steps: StepsOpt(
        f"Profiled steps per scenario, after warm-up [default: {by_quick(ProfileOptions.STEPS)}]."
    ) = None,
    model_size: Annotated[
        ModelSize,
        typer.Option(
            "--model-size",
            case_sensitive=False,
            help="GPT-2 configuration to train: tiny (2 layers, width 128), small (4, 256) "
            "or base (GPT-2 small); auto: tiny on CPU, small on CUDA.",
        ),
    ] = ModelSize.auto,
    device: Annotated[
        Device, typer.Option("--device", case_sensitive=False, help="Where to train.")
    ] = Device.auto,
    cold: Annotated[
        bool,
        typer.Option("--cold", help="Evict the data from the page cache after the warm-up."),
    ] = False,
    trace_dir: Annotated[
        str | None,
        typer.Option(
            "--trace-dir",
            metavar="DIR",
            help="Keep each scenario's Chrome trace here (TensorBoard, Perfetto, --trace).",
            show_default=False,
        ),
    ] = None,
    tokenizer: TokenizerOpt(
        "Add a third layout, raw text tokenized in the DataLoader by this "
        "transformers tokenizer (a local directory or a cached name; never downloaded)."
    ) = None,
    batch_timeout: BatchTimeoutOpt = None,
    trace: Annotated[
        list[str] | None,
        typer.Option(
            "--trace",
            metavar="FILE|DIR",
            help="Analyse torch.profiler (Kineto) Chrome traces, .json or .json.gz, instead "
            "of running a loop: step time, data wait, GPU idle, copies, per rank and GPU. "
            "Repeat for several ranks' files, or name the directory that holds them.",
            show_default=False,
        ),
    ] = None,
    max_bytes: Annotated[
        str | None,
        typer.Option(
            "--max-trace-bytes",
            metavar="SIZE",
            help="With --trace: the most JSON one trace file may hold, unpacked, such as "
            f"16GiB; it is read whole, so this bounds memory [default: "
            f"{size_text(TraceOptions.max_bytes)}; 0: no limit].",
            show_default=False,
        ),
    ] = None,
    max_seconds: Annotated[
        float | None,
        typer.Option(
            "--max-trace-seconds",
            metavar="SECONDS",
            callback=finite(0.0, MOST_SECONDS),
            help="With --trace: end in one line (exit 2) when reading and analysing the "
            f"traces takes longer [default: {TraceOptions.max_seconds:g}; 0: no limit].",
            show_default=False,
        ),
    ] = None,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """How do the links add up in a training step? A real loop under torch.profiler.

    A small GPT-2 (random weights, nothing downloaded) trains on token sequences stored
    one file per sample and as MDS shards (and, with --tokenizer, as raw text tokenized
    in the loader), for each num_workers; each step is timed in five phases: data wait,
    host-to-device copy, forward, backward, optimizer.
    With --trace FILE|DIR, your own run's traces are analysed instead, every rank.
    """
    c = context_of(ctx)
    out = Outputs.check(
        json_path, markdown_path, fail_on, inputs=[("--trace", t) for t in trace or ()]
    )
    fence(ctx, TRACES if trace is not None else LOOP)
    if trace is not None:
        options = _trace_options(trace, max_bytes, max_seconds)
        result = measure_one(options, c, out, None).result
        # The trace describes the machine it was recorded on, not this one.
        return emit(build_report("profile", None, [result], c), out, c)
    from starvecheck.probe.machine import collect

    # Before PATH is looked at: what would end the process as the model's libraries load.
    for library in ("torch", "transformers"):
        surroundings.check(library)
    options = _loop_options(
        path, workers, steps, model_size, device, cold, trace_dir, tokenizer, quick
    )
    machine = collect(SysRoot(Path("/")), path=options.path, environ=c.environ)
    result = measure_one(options, c, out, machine, batch_timeout).result
    return emit(build_report("profile", machine, [result], c), out, c)


def _trace_options(
    trace: list[str], max_bytes: str | None, max_seconds: float | None
) -> TraceOptions:
    """`profile --trace`'s options: the traces, --max-trace-bytes parsed (exit 2), and
    --max-trace-seconds (0: no limit)."""
    limit = (
        TraceOptions.max_bytes
        if max_bytes is None
        else args.byte_limit("--max-trace-bytes", max_bytes)
    )
    seconds = TraceOptions.max_seconds if max_seconds is None else max_seconds
    return TraceOptions(tuple(trace), limit, seconds or None)


def _loop_options(
    path: str | None,
    workers: str | None,
    steps: int | None,
    model_size: ModelSize,
    device: Device,
    cold: bool,
    trace_dir: str | None,
    tokenizer: str | None,
    quick: bool,
) -> ProfileOptions:
    """The profiled loop's options from the command's values (in its signature's
    order), each string parsed and checked (one line, exit 2)."""
    target = args.data_path(path, False, "profile")
    # Checked in this order: made, parsed, or refused in one line.
    made = args.output_dir("--trace-dir", trace_dir) if trace_dir is not None else None
    sweep = args.worker_counts(workers, 64)
    return ProfileOptions(
        path=target,
        workers=sweep,
        steps=steps,
        model_size=model_size.value,
        device=device.value,
        cold=cold,
        trace_dir=made,
        tokenizer=tokenizer,
        quick=quick,
    )
