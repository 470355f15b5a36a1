"""The command line: one thin function per subcommand, one module per command.

options -> stage -> advice -> render -> exit status. Every error becomes one line
and an exit status in `main`, the one place that decides them; tracebacks only
with --debug (or STARVECHECK_DEBUG=1).
"""

from __future__ import annotations

import errno
import signal
import sys
import traceback
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout

import typer

from starvecheck.cli.common import app, error
from starvecheck.core import stages as stages_table
from starvecheck.core import streams, surroundings
from starvecheck.core.context import Context
from starvecheck.core.signals import Terminated, forget_received, received, signals_raise
from starvecheck.core.status import ExitStatus, StarvecheckError, signal_status
from starvecheck.core.text import readable


def register() -> None:
    """Every command the stage table names: each module registers its command when
    imported (once; again, it is a lookup in sys.modules). `starvecheck --help` lists
    them in the table's order (core/stages.py): the machine, then the chain from storage
    to the GPU step, doctor, the running job, then housekeeping. Run at import, so `app`
    is whole for whoever reads it, and by `main`, so a row is all a command needs."""
    for name in stages_table.commands():
        stages_table.load(name)


register()


def main(argv: Sequence[str] | None = None, context: Context | None = None) -> int:
    """Run the CLI; return the exit status instead of exiting (tests call this)."""
    register()
    c = context or Context()
    # A C or Latin-1 locale: the report's "…" and "·" as ASCII, not an error at the end.
    for stream in (c.stdout, c.stderr):
        readable(stream)
    words = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in words or bool(c.environ.get("STARVECHECK_DEBUG"))
    forget_received()
    if c.stdout is None and not any(w in ("-h", "--help", "--version") for w in words):
        # `starvecheck env >&-`: Python starts with sys.stdout None. As `ls >&-` does.
        error(c, "cannot write the report: standard output is closed")
        return ExitStatus.USAGE
    try:
        # click writes help and --version with its own echo to sys.stdout/err.
        # Signals raise from here on, not only while a stage measures: one that ends
        # the process between stages would leave DataLoader workers it never stopped.
        with signals_raise(), redirect_stdout(c.stdout), redirect_stderr(c.stderr):
            try:
                rv = app(args=words, prog_name="starvecheck", standalone_mode=False, obj=c)
            finally:
                streams.put_back()  # fd 1 moved for the user's code: back (a test's process)
    except typer.TyperException as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `starvecheck`: the help, as is
            c.stderr.write(e.format_message().rstrip() + "\n")
            return e.exit_code
        # Typer's (vendored) click errors: bad option, bad choice, missing argument.
        command = getattr(getattr(e, "ctx", None), "command_path", None)
        hint = f" (see '{command} --help')" if command and e.exit_code == 2 else ""
        error(c, f"{_one_line(e.format_message())}{hint}")
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return _signalled(c, signal.SIGINT)
    except Terminated as e:
        return _signalled(c, e.signum)
    except StarvecheckError as e:
        if debug:
            traceback.print_exc(file=c.stderr)
        if (signum := received()) is not None:
            return _signalled(c, signum)  # the signal stopped the workers too: not news
        if (why := surroundings.limit_cause(e)) is not None:
            # A stage's own words for memory it could not have ("the training loop
            # failed: ... can't allocate memory"): the limit is the cause to name.
            error(c, why)
            return ExitStatus.USAGE
        error(c, str(e))
        return e.status
    except BrokenPipeError:
        # `starvecheck env --json - | head`: the reader left; not an error of ours.
        sys.stdout = None  # type: ignore[assignment]  # keep Python from flushing at exit
        return ExitStatus.OK
    except Exception as e:
        if debug:
            traceback.print_exc(file=c.stderr)
        if (signum := received()) is not None:
            return _signalled(c, signum)
        if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
            # Preflight (stages/dataloader/preflight.py) leaves a margin; a run that still
            # runs out: one line.
            error(c, f"too many open files ({e.strerror}): raise the limit (ulimit -n 1024)")
            return ExitStatus.USAGE
        if (why := surroundings.limit_cause(e)) is not None:
            # Memory that could not be mapped under `ulimit -v`: the limit is the cause.
            error(c, why)
            return ExitStatus.USAGE
        if debug:
            error(c, f"internal error: {type(e).__name__}: {e}")
        else:
            error(
                c,
                f"internal error: {type(e).__name__}: {_one_line(str(e))} "
                "(rerun with --debug for the traceback, and please report it)",
            )
        return 70  # EX_SOFTWARE
    if rv == ExitStatus.INTERRUPTED:  # Typer turns KeyboardInterrupt into a silent 130
        error(c, "interrupted")
    return ExitStatus.OK if rv is None else int(rv)


def _signalled(c: Context, signum: int) -> int:
    """One line, and the status a shell gives a process this signal ended: 130 for
    Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    if signum == signal.SIGINT:
        error(c, "interrupted")
    else:
        error(c, f"terminated by {signal.Signals(signum).name}")
    return signal_status(signum)


def _one_line(text: str) -> str:
    return " ".join(text.split())
