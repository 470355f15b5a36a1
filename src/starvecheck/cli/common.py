"""What every command shares: the Typer app, the common options, output checks,
report emission (starvecheck.advice.report builds the report), the progress bar, warnings
and errors."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from starvecheck.core import outputs, streams, surroundings
from starvecheck.core.context import Context
from starvecheck.core.model import Severity, StageResult, at_or_above
from starvecheck.core.report import Report
from starvecheck.core.status import ExitStatus, Unavailable, UsageError
from starvecheck.core.text import printable
from starvecheck.core.version import __version__
from starvecheck.probe.sysroot import ENV_VAR, SysRoot
from starvecheck.stages.options import BATCH_TIMEOUT_S, MOST_SECONDS, number

if TYPE_CHECKING:
    from starvecheck.probe.machine import Machine
    from starvecheck.stages.base import Measured
    from starvecheck.stages.options import StageOptions

app = typer.Typer(
    name="starvecheck",
    help="Why is my GPU waiting? Measures each link of the input pipeline and says what "
    "to change first.",
    epilog="Start with: starvecheck doctor",
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


# Options every command takes (docs/architecture.md, "Command-line conventions").
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


def WorkersOpt(help: str) -> Any:
    """--workers N[,N...]: the num_workers values a command sweeps."""
    return Annotated[
        str | None,
        typer.Option("--workers", metavar="N[,N...]", help=help, show_default=False),
    ]


def TokenizerOpt(help: str) -> Any:
    """--tokenizer NAME: a transformers tokenizer, local files only."""
    return Annotated[
        str | None,
        typer.Option("--tokenizer", metavar="NAME", help=help, show_default=False),
    ]


def StepsOpt(help: str) -> Any:
    """--steps N: measured steps, after warm-up."""
    return Annotated[
        int | None,
        typer.Option("--steps", min=1, max=100_000, help=help, show_default=False),
    ]


def finite(low: float, high: float, above: bool = False) -> Callable[[float | None], float | None]:
    """A float option's check (its `callback`): a number from `low` (or, with `above`,
    above it) to `high`. click's own range lets nan through, and inf where unbounded.
    Every float option of every command has it (tests/test_strict_numbers.py finds them
    in the app and checks `finite_range`)."""

    def check(value: float | None) -> float | None:
        if value is None:
            return None
        if not (
            math.isfinite(value) and (value > low if above else value >= low) and value <= high
        ):
            raise typer.BadParameter(
                f"{value:g}: expected {'over' if above else 'from'} {low:g} to {high:,g}"
            )
        return value

    check.finite_range = (low, high)  # type: ignore[attr-defined]
    return check


# --batch-timeout: where a command iterates a DataLoader (loader, starve, profile,
# doctor). None: the default (stages/options.BATCH_TIMEOUT_S), which the help states.
BatchTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--batch-timeout",
        metavar="SECONDS",
        callback=finite(0.0, MOST_SECONDS),
        help="End in one line (exit 2) when the DataLoader delivers no batch for this "
        "long, worker start-up included: a stuck worker or dataset "
        f"[default: {number(BATCH_TIMEOUT_S)}; 0: no limit].",
        show_default=False,
    ),
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
        context_of(ctx).debug = True


@dataclass(frozen=True)
class Outputs:
    json: str | None
    markdown: str | None
    fail_on: FailOn
    # The working directory when the outputs were checked: a relative one is written
    # there, whatever the user's code (`loader --factory`) did with the directory since.
    cwd: str = ""

    def file(self, path: str) -> str:
        """Where `path`, as given, is written."""
        return os.path.join(self.cwd, path)

    @property
    def terminal(self) -> bool:
        return "-" not in (self.json, self.markdown)

    @classmethod
    def check(
        cls,
        json_path: str | None,
        markdown_path: str | None,
        fail_on: FailOn,
        *,
        plot: str | None = None,
        inputs: Sequence[tuple[str, str | None]] = (),
    ) -> Outputs:
        """Refuse, before anything is measured, what cannot take the report (args.
        output_file), two outputs naming one file, an output naming one of the `inputs`
        ((option, path): the trace, dataset, ... the command reads), and stdout twice."""
        from starvecheck.cli import args

        if json_path == "-" and markdown_path == "-":
            raise UsageError("--json - and --markdown - cannot both write to stdout")
        written = [("--json", json_path), ("--markdown", markdown_path), ("--plot", plot)]
        for option, value in written:
            surroundings.check_relative(f"{option} {value}", value)
        args.distinct_files(written, inputs)
        for option, value in (("--json", json_path), ("--markdown", markdown_path)):
            if value is not None and value != "-":
                args.output_file(option, value)
        cwd = ""
        with contextlib.suppress(OSError):  # a working directory removed: paths as given
            cwd = os.getcwd()
        return cls(json_path, markdown_path, fail_on, cwd)


def context_of(ctx: typer.Context) -> Context:
    root = ctx.find_root()
    if not isinstance(root.obj, Context):
        root.obj = Context()
    return root.obj


def sysroot_of(c: Context) -> SysRoot:
    root = SysRoot.from_environ(dict(c.environ))
    if not root.root.is_dir():
        raise UsageError(f"{ENV_VAR}={root.root}: not a directory")
    return root


def measure_one(
    options: StageOptions,
    c: Context,
    out: Outputs,
    machine: Machine | None,
    batch_timeout_s: float | None = None,
    *,
    refused: Callable[[StageResult], object] | None = None,
) -> Measured:
    """A command's one stage, the one way every command runs it: the stage its
    options name, from the registry; plan once from the typed options (bad ones are
    one line and exit 2 before anything runs); a stage that cannot measure here hands
    what it can report to `refused` (then exit 3); else measure with a progress bar.
    `batch_timeout_s`: --batch-timeout where the command has it (None: the default)."""
    from starvecheck.stages import registry
    from starvecheck.stages.base import RunContext, timed

    stage = registry.get(options.stage)
    ctx = RunContext(machine=machine, environ=c.environ, warn=lambda msg: warning(c, msg))
    if batch_timeout_s is not None:
        ctx = replace(ctx, batch_timeout_s=batch_timeout_s)
    plan = stage.plan(options, ctx)
    if (refusal := stage.refusal(plan, ctx)) is not None:
        if refusal.result is not None and refused is not None:
            refused(refusal.result)
        raise Unavailable(refusal.message)
    with progress_bar(c, out) as progress:
        return timed(stage, plan, replace(ctx, progress=progress))


def emit(report: Report, out: Outputs, c: Context) -> int:
    try:
        return _emit(report, out, c)
    except BrokenPipeError:
        raise  # `| head`: the reader left; main says nothing
    except OSError as e:
        if e.filename is not None:
            raise
        # stdout itself: a full disk (`> /dev/full`), a closed or revoked terminal.
        _abandon(streams.report(c.stdout))
        raise UsageError(f"cannot write to standard output: {e.strerror}") from e


def _abandon(stream: Any) -> None:
    """Point a stream that cannot be written at /dev/null: what is left in its buffer
    would otherwise fail again when Python flushes it at exit (exit 120, a second
    message; hidden where PYTHONUNBUFFERED is set)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)


def _emit(report: Report, out: Outputs, c: Context) -> int:
    from starvecheck.render import json as json_export
    from starvecheck.render import markdown as markdown_export

    stdout = streams.report(c.stdout)  # the real stdout, where the user's code moved fd 1
    for path, serialize in (
        (out.json, json_export.serialize),
        (out.markdown, markdown_export.serialize),
    ):
        if path == "-":
            stdout.write(serialize(report))
            stdout.flush()
        elif path is not None:
            option = "--json" if path == out.json else "--markdown"
            outputs.write(option, path, out.file(path), serialize(report).encode("utf-8"))
    if out.terminal:
        from starvecheck.render.terminal import as_text

        stdout.write(as_text(report, c.console(stdout)))
        stdout.flush()
    return exit_status(report, out.fail_on)


def exit_status(report: Report, fail_on: FailOn) -> int:
    if fail_on is not FailOn.never and at_or_above(report.findings, Severity(fail_on.value)):
        return ExitStatus.FINDINGS
    return ExitStatus.OK


@contextmanager
def progress_bar(c: Context, out: Outputs) -> Iterator[Callable[[str, int, int], None]]:
    """A transient progress bar on stderr, when a person is watching (docs/architecture.md)."""
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


def warning(c: Context, message: str) -> None:
    _say(c, f"starvecheck: warning: {message}")


def error(c: Context, message: str) -> None:
    _say(c, f"starvecheck: error: {message}")


def _say(c: Context, line: str) -> None:
    """One line on stderr: control characters in it (a path holding an escape sequence
    or a newline, echoed from the user's input) are shown escaped, never sent to the
    terminal. Nowhere to say it (stderr closed): nothing."""
    if c.stderr is None:
        return
    c.stderr.write(printable(line) + "\n")
    c.stderr.flush()
