"""The command line: one thin function per subcommand.

options -> stage -> advice -> render -> exit status. Every error becomes one line
and an exit status in `main`, the one place that decides them; tracebacks only
with --debug (or STARVECHECK_DEBUG=1).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from starvecheck import __version__, args
from starvecheck.advice import rank, verdict
from starvecheck.context import Context
from starvecheck.model import Report, Severity, StageResult, at_or_above
from starvecheck.scratch import Terminated
from starvecheck.stages.strategies import STRATEGIES
from starvecheck.status import ExitStatus, StarvecheckError, UsageError
from starvecheck.sysroot import ENV_VAR, SysRoot

app = typer.Typer(
    name="starvecheck",
    help="Why is my GPU waiting? Measures each link of the input pipeline and says what "
    "to change first.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class FailOn(str, Enum):
    never = "never"
    warning = "warning"
    critical = "critical"


# Options every command takes (DESIGN.md, "Command-line conventions").
JsonOpt = Annotated[
    str | None,
    typer.Option(
        "--json", metavar="PATH", help="Write the report as JSON to PATH ('-' for stdout)."
    ),
]
MarkdownOpt = Annotated[
    str | None,
    typer.Option(
        "--markdown", metavar="PATH", help="Write a Markdown summary to PATH ('-' for stdout)."
    ),
]
FailOnOpt = Annotated[
    FailOn,
    typer.Option(
        "--fail-on",
        case_sensitive=False,
        help="Exit 1 when a finding is at or above this severity.",
    ),
]


def PlotOpt(what: str) -> Any:  # capitalised: it reads like the other option types
    """--plot PATH, described by what the picture shows."""
    return Annotated[
        str | None,
        typer.Option("--plot", metavar="PATH", help=f"Write a PNG of {what} (extra 'plot')."),
    ]


QuickOpt = Annotated[
    bool, typer.Option("--quick", help="Small sizes for CI smoke runs: seconds, not minutes.")
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"starvecheck {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    if debug:
        _context(ctx).debug = True


@dataclass(frozen=True)
class Outputs:
    json: str | None
    markdown: str | None
    fail_on: FailOn

    @property
    def terminal(self) -> bool:
        return "-" not in (self.json, self.markdown)

    @classmethod
    def check(cls, json_path: str | None, markdown_path: str | None, fail_on: FailOn) -> Outputs:
        """Refuse unwritable destinations before anything is measured."""
        if json_path == "-" and markdown_path == "-":
            raise UsageError("--json - and --markdown - cannot both write to stdout")
        for option, value in (("--json", json_path), ("--markdown", markdown_path)):
            if value is None or value == "-":
                continue
            if value == "":
                raise UsageError(f"{option} needs a path, or '-' for stdout")
            target = Path(value)
            if target.is_dir():
                raise UsageError(f"{option} {value}: is a directory")
            parent = target.parent  # Path("r.json").parent is Path(".")
            if not parent.is_dir():
                raise UsageError(f"{option} {value}: directory {parent} does not exist")
            if not os.access(parent, os.W_OK) or (
                target.exists() and not os.access(target, os.W_OK)
            ):
                raise UsageError(f"{option} {value}: not writable")
        return cls(json_path, markdown_path, fail_on)


def _context(ctx: typer.Context) -> Context:
    root = ctx.find_root()
    if not isinstance(root.obj, Context):
        root.obj = Context()
    return root.obj


def _sysroot(c: Context) -> SysRoot:
    root = SysRoot.from_environ(dict(c.environ))
    if not root.root.is_dir():
        raise UsageError(f"{ENV_VAR}={root.root}: not a directory")
    return root


def _build_report(
    command: str, machine: dict[str, Any], stages: list[StageResult], c: Context
) -> Report:
    findings = [f for s in stages for f in s.findings]
    checklist = rank(findings)
    return Report(
        command=command,
        machine=machine,
        stages=tuple(stages),
        checklist=checklist,
        verdict=verdict(checklist, len(findings)),
        tool_version=__version__,
        created_at=c.now(),
    )


def _emit(report: Report, out: Outputs, c: Context) -> int:
    from starvecheck.render import json as json_export
    from starvecheck.render import markdown as markdown_export

    for path, serialize in (
        (out.json, json_export.serialize),
        (out.markdown, markdown_export.serialize),
    ):
        if path == "-":
            c.stdout.write(serialize(report))
            c.stdout.flush()
        elif path is not None:
            try:
                Path(path).write_text(serialize(report), encoding="utf-8")
            except OSError as e:
                raise UsageError(f"cannot write {path}: {e.strerror}") from e
    if out.terminal:
        from starvecheck.render.terminal import render

        console = c.console()
        with console.capture() as captured:
            render(report, console)
        # rich pads table cells to the full width; trailing blanks only get in the way
        # of copy-paste and diffs.
        c.stdout.write("\n".join(line.rstrip() for line in captured.get().split("\n")))
        c.stdout.flush()
    if out.fail_on is not FailOn.never and at_or_above(
        report.findings, Severity(out.fail_on.value)
    ):
        return ExitStatus.FINDINGS
    return ExitStatus.OK


@app.command()
def env(
    ctx: typer.Context,
    path: Annotated[
        str | None,
        typer.Argument(
            help="Data directory whose storage to describe (default: the working directory).",
            show_default=False,
        ),
    ] = None,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """Facts about this machine that decide how fast data can reach the GPU.

    CPU quota and affinity, throttling, memory and /dev/shm, locked-memory and
    open-file limits, NUMA, GPUs and their PCIe links, container, storage and
    library versions, each with what it means for a DataLoader. Reads only;
    --quick changes nothing (env is always quick).
    """
    from starvecheck.probe.machine import resolve_data_path
    from starvecheck.stages import env as env_stage

    c = _context(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    root = _sysroot(c)
    if path is not None and not root.exists(resolve_data_path(root, path)):
        where = "" if root.real else f" in {ENV_VAR}={root.root}"
        raise UsageError(f"{path}: no such file or directory{where}")
    machine, result = env_stage.run(root, path=path, environ=c.environ)
    return _emit(_build_report("env", machine.to_dict(), [result], c), out, c)


# `io` sizes: (samples, runs) by default and with --quick; --existing reads real
# files, fewer by default (each may be large, and the storage may be remote).
IO_DEFAULTS = {"generated": (10_000, 5), "existing": (1_000, 5)}
IO_QUICK = {"generated": (2_000, 3), "existing": (200, 3)}


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
            max=10_000_000,
            help="Samples to write and read [default: 10000; 2000 with --quick]. With "
            "--existing: files (or byte ranges) to read [default: 1000; 200 with --quick].",
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
    ] = "16K",
    runs: Annotated[
        int | None,
        typer.Option(
            "--runs",
            min=1,
            max=1000,
            help="Measured runs per pattern, after a warm-up [default: 5; 3 with --quick].",
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
    ] = True,
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
    from starvecheck import cache
    from starvecheck.probe.machine import collect
    from starvecheck.stages import io as io_stage

    c = _context(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    mode = "existing" if existing else "generated"
    size = args.sample_size(sample_size)
    if keep and existing:
        raise UsageError("--keep: nothing is written with --existing, so there is nothing to keep")
    if drop_caches and not cold:
        raise UsageError("--drop-caches only applies to cold runs; drop --no-cold or it")
    if drop_caches and (problem := cache.drop_caches_problem()):
        raise UsageError(f"--drop-caches: {problem}")
    target = args.data_path(path, existing)
    # io measures this machine, never a fake sysroot: facts and figures must match.
    machine = collect(SysRoot(Path("/")), path=target, environ=c.environ)
    default_samples, default_runs = (IO_QUICK if quick else IO_DEFAULTS)[mode]
    n_samples = samples or default_samples
    if not existing and (problem := io_stage.space_problem(target, n_samples, size)):
        raise UsageError(problem)
    plan = io_stage.Plan(
        samples=n_samples,
        sample_size=size,
        runs=runs or default_runs,
        threads=args.thread_counts(threads, machine.cpu.effective_cpus),
        cold=cold,
        drop_caches=drop_caches,
        keep=keep,
    )
    with _progress(c, out) as progress:
        result = io_stage.run(
            target,
            plan,
            existing=existing,
            storage=machine.to_dict()["storage"],
            progress=progress,
            warn=lambda msg: _warning(c, msg),
        )
    return _emit(_build_report("io", machine.to_dict(), [result], c), out, c)


# `loader` sizes: (samples, runs), as for io. Every run is an epoch through a fresh
# DataLoader per layout, cache state and worker count; --quick fits in 30 s on 2 cores.
LOADER_DEFAULTS = {"generated": (5_000, 3), "existing": (1_000, 3)}
LOADER_QUICK = {"generated": (1_000, 3), "existing": (200, 3)}


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
    workers: Annotated[
        str | None,
        typer.Option(
            "--workers",
            metavar="N[,N...]",
            help="num_workers values to sweep [default: 0, 1, 2, 4, ... up to twice the "
            "effective CPUs, at least 4].",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=100_000, help="Samples per batch.")
    ] = 32,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            min=1,
            max=10_000_000,
            help="Samples to write and read per epoch [default: 5000; 1000 with --quick]. "
            "With --existing: files to read [default: 1000; 200 with --quick].",
            show_default=False,
        ),
    ] = None,
    sample_size: Annotated[
        str,
        typer.Option(
            "--sample-size", metavar="SIZE", help="Bytes per sample: 16K, 1MiB, 1.5M, ..."
        ),
    ] = "16K",
    prefetch_factor: Annotated[
        int,
        typer.Option("--prefetch-factor", min=1, max=1024, help="Batches each worker loads ahead."),
    ] = 2,
    pin_memory: Annotated[
        bool | None,
        typer.Option(
            "--pin-memory/--no-pin-memory",
            help="Pin batches in page-locked memory [default: when a CUDA device is present].",
            show_default=False,
        ),
    ] = None,
    runs: Annotated[
        int | None,
        typer.Option(
            "--runs",
            min=1,
            max=1000,
            help="Epochs per layout, cache state and worker count [default: 3].",
            show_default=False,
        ),
    ] = None,
    cold: Annotated[
        bool,
        typer.Option(
            "--cold/--no-cold",
            help="Also measure with the page cache emptied (posix_fadvise, checked with mincore).",
        ),
    ] = True,
    existing: Annotated[
        bool,
        typer.Option(
            "--existing",
            help="Read a sample of the real files under PATH, one file per sample, instead "
            "of generating data. Never writes, renames or deletes anything there.",
        ),
    ] = False,
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
    from starvecheck.stages import io as io_stage
    from starvecheck.stages import loader as loader_stage

    c = _context(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    size = args.sample_size(sample_size)
    sweep = args.counts("--workers", workers, 0, 1024) if workers else None
    plot_path = args.plot_path(plot)
    target = args.data_path(path, existing, "loader")
    machine = collect(SysRoot(Path("/")), path=target, environ=c.environ)
    eff = max(1, machine.cpu.effective_cpus or 1)
    mode = "existing" if existing else "generated"
    default_samples, default_runs = (LOADER_QUICK if quick else LOADER_DEFAULTS)[mode]
    n_samples = samples or default_samples
    if not existing and (
        problem := io_stage.space_problem(
            target, n_samples, size, loader_stage.space_needed(n_samples, size)
        )
    ):
        raise UsageError(problem)
    plan = loader_stage.Plan(
        samples=n_samples,
        sample_size=size,
        workers=sweep or args.default_workers(eff),
        runs=runs or default_runs,
        batch_size=batch_size,
        prefetch_factor=prefetch_factor,
        pin_memory=pin_memory,
        cold=cold,
        effective_cpus=eff,
    )
    with _progress(c, out) as progress:
        result = loader_stage.run(
            target,
            plan,
            existing=existing,
            storage=machine.to_dict()["storage"],
            progress=progress,
            warn=lambda msg: _warning(c, msg),
        )
    if plot_path:
        from starvecheck.render.plot import loader_plot

        loader_plot(result, plot_path)
    return _emit(_build_report("loader", machine.to_dict(), [result], c), out, c)


@contextmanager
def _progress(c: Context, out: Outputs) -> Iterator[Callable[[str, int, int], None]]:
    """A transient progress bar on stderr, when a person is watching (DESIGN.md)."""
    isatty = getattr(c.stderr, "isatty", lambda: False)()
    if not (isatty and out.terminal):
        yield lambda what, done, total: None
        return
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    console = c.console(c.stderr)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            phase = "writing" if what.startswith("writing") else "measuring"
            if phase not in tasks:
                tasks[phase] = bar.add_task(what, total=total)
            bar.update(tasks[phase], completed=done, total=total, description=what)

        yield update


@app.command()
def starve(
    ctx: typer.Context,
    sample_ms: Annotated[
        float,
        typer.Option(
            "--sample-ms",
            min=0.0,
            max=10_000.0,
            help="D: CPU milliseconds of work per sample in a worker.",
        ),
    ] = 5.0,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=100_000, help="B: samples per batch.")
    ] = 32,
    step_ms: Annotated[
        float,
        typer.Option(
            "--step-ms",
            min=0.0,
            max=60_000.0,
            help="G: milliseconds the consumer (the GPU step) takes per batch.",
        ),
    ] = 50.0,
    workers: Annotated[
        str | None,
        typer.Option(
            "--workers",
            metavar="N[,N...]",
            help="num_workers values to sweep [default: 0, 1, 2, 4, ... up to twice the "
            "effective CPUs, at least 4].",
            show_default=False,
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps",
            min=1,
            max=100_000,
            help="Measured steps per point, after 3 warm-up steps [default: 20; 8 with --quick].",
            show_default=False,
        ),
    ] = None,
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
    from starvecheck.stages import starve as starve_stage

    c = _context(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    if sleep and tokenizer:
        raise UsageError("--sleep and --tokenizer: choose one kind of work per sample")
    plot_path = args.plot_path(plot)
    machine = collect(SysRoot(Path("/")), environ=c.environ)
    eff = max(1, machine.cpu.effective_cpus or 1)
    plan = starve_stage.Plan(
        sample_ms=sample_ms,
        batch_size=batch_size,
        step_ms=step_ms,
        workers=args.counts("--workers", workers, 0, 1024)
        if workers
        else args.default_workers(eff),
        steps=steps or (8 if quick else 20),
        sleep=sleep,
        effective_cpus=eff,
        tokenizer=tokenizer,
    )
    with _progress(c, out) as progress:
        result = starve_stage.run(plan, progress)
    if plot_path:
        from starvecheck.render.plot import sweep_plot

        sweep_plot(result, plot_path)
    return _emit(_build_report("starve", machine.to_dict(), [result], c), out, c)


class DataFormat(str, Enum):
    auto = "auto"
    jsonl = "jsonl"
    json = "json"
    parquet = "parquet"
    csv = "csv"
    tsv = "tsv"
    text = "text"


# --current's choices; the ids live in one place, stages/strategies.py (no numpy there).
Strategy = Enum("Strategy", {s: s for s in STRATEGIES}, type=str)  # type: ignore[misc]


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
    data_format: Annotated[
        DataFormat,
        typer.Option("--format", case_sensitive=False, help="Dataset format (auto: by suffix)."),
    ] = DataFormat.auto,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            metavar="NAME",
            help="transformers tokenizer to count tokens with: a local directory or a "
            "cached name; never downloaded.",
            show_default=False,
        ),
    ] = None,
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
            "--context", min=1, max=10_000_000, help="Context length (max_length) in tokens."
        ),
    ] = 4096,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            min=1,
            max=1_000_000,
            help="Samples per batch; rows of --context tokens per batch when packing.",
        ),
    ] = 32,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=1,
            max=1_000_000_000,
            help="Measure the first N samples [default: all; 20,000 with --quick; the "
            "embedded default has 2,000].",
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
    ] = Strategy.dynamic,  # type: ignore[attr-defined]
    seed: Annotated[
        int,
        typer.Option("--seed", min=0, max=2**32 - 1, help="Seed of the shuffles."),
    ] = 0,
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
    from starvecheck.stages import pad as pad_stage

    c = _context(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    names = tuple(n.strip() for f in fields or () for n in f.split(","))
    if any(not n for n in names):
        raise UsageError("--field: empty field name")
    if dataset is not None and lengths is not None:
        raise UsageError("--dataset and --lengths: choose one source of lengths")
    if dataset is None:
        for option, given in (
            ("--tokenizer", tokenizer),
            ("--field", names),
            ("--format", data_format is not DataFormat.auto),
        ):
            if given:
                raise UsageError(f"{option} applies to --dataset")
    if lengths == "" or dataset == "":
        raise UsageError(f"{'--lengths' if lengths == '' else '--dataset'} needs a path")
    plot_path = args.plot_path(plot)
    plan = pad_stage.Plan(
        context=context,
        batch_size=batch_size,
        current=current.value,
        seed=seed,
        limit=limit or (pad_stage.QUICK_LIMIT if quick and (dataset or lengths) else None),
        dataset=dataset,
        fmt=None if data_format is DataFormat.auto else data_format.value,
        fields=names,
        tokenizer=tokenizer,
        lengths=lengths,
    )
    with _progress(c, out) as progress:
        run = pad_stage.run(plan, progress, c.stdin)
    if plot_path:
        from starvecheck.render.plot import pad_plot

        pad_plot(run, plot_path)
    machine = collect(SysRoot(Path("/")), environ=c.environ)
    return _emit(_build_report("pad", machine.to_dict(), [run.result], c), out, c)


def main(argv: Sequence[str] | None = None, context: Context | None = None) -> int:
    """Run the CLI; return the exit status instead of exiting (tests call this)."""
    c = context or Context()
    words = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in words or bool(c.environ.get("STARVECHECK_DEBUG"))
    try:
        # click writes help and --version with its own echo to sys.stdout/err.
        with redirect_stdout(c.stdout), redirect_stderr(c.stderr):
            rv = app(args=words, prog_name="starvecheck", standalone_mode=False, obj=c)
    except typer.TyperException as e:
        # Typer's (vendored) click errors: bad option, bad choice, missing argument.
        command = getattr(getattr(e, "ctx", None), "command_path", None)
        hint = f" (see '{command} --help')" if command and e.exit_code == 2 else ""
        _error(c, f"{_one_line(e.format_message())}{hint}")
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        _error(c, "interrupted")
        return ExitStatus.INTERRUPTED
    except Terminated as e:
        _error(c, f"terminated by {signal.Signals(e.signum).name}")
        return ExitStatus.TERMINATED
    except StarvecheckError as e:
        if debug:
            traceback.print_exc(file=c.stderr)
        _error(c, str(e))
        return e.status
    except BrokenPipeError:
        # `starvecheck env --json - | head`: the reader left; not an error of ours.
        sys.stdout = None  # type: ignore[assignment]  # keep Python from flushing at exit
        return ExitStatus.OK
    except Exception as e:
        if debug:
            traceback.print_exc(file=c.stderr)
            _error(c, f"internal error: {type(e).__name__}: {e}")
        else:
            _error(
                c,
                f"internal error: {type(e).__name__}: {_one_line(str(e))} "
                "(rerun with --debug for the traceback, and please report it)",
            )
        return 70  # EX_SOFTWARE
    if rv == ExitStatus.INTERRUPTED:  # Typer turns KeyboardInterrupt into a silent 130
        _error(c, "interrupted")
    return ExitStatus.OK if rv is None else int(rv)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _warning(c: Context, message: str) -> None:
    c.stderr.write(f"starvecheck: warning: {message}\n")
    c.stderr.flush()


def _error(c: Context, message: str) -> None:
    c.stderr.write(f"starvecheck: error: {message}\n")
    c.stderr.flush()
