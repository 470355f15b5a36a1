"""starvecheck: why is my GPU waiting, and what do I change first?"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starvecheck.loop.timer import Watch

from starvecheck.core import clocks as _clocks  # noqa: F401  # the real clocks, bound first
from starvecheck.core.version import __version__

__all__ = ["__version__", "watch"]


def watch(iterable: Any, **options: Any) -> Watch[Any]:
    """Time your own training loop's wait for data: `for batch in watch(loader): ...`.
    Options: sync (torch.cuda.synchronize() each step), every (print every N steps),
    file (default stderr), show (print at the end), barrier (under torch.distributed:
    time a dist.barrier() once each batch is in hand, measuring the wait for the other
    ranks). Under torch.distributed rank 0 reports every rank. See starvecheck.loop;
    for transformers' and Lightning's Trainers, starvecheck.integrations."""
    from starvecheck.loop.timer import watch as _watch

    return _watch(iterable, **options)


def entry() -> int:
    """The console script. Importing the CLI (typer, rich) takes ~0.2 s; a Ctrl-C in
    that time is one line and exit 130, as it is once `cli.main` runs, and memory that
    cannot be had under `ulimit -v` is one line and exit 2 (core/surroundings.py)."""
    import signal
    import sys

    # A Ctrl-C that lands in a finalizer or a gc callback while the CLI imports is
    # printed as "Exception ignored" and lost, and the run would go on: it is counted
    # here and ends the run all the same.
    got: list[int] = []
    hook = sys.unraisablehook

    def interrupted(signum: int, frame: object) -> None:
        got.append(signum)
        raise KeyboardInterrupt

    def swallowed(info: sys.UnraisableHookArgs) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            hook(info)

    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, interrupted)
        sys.unraisablehook = swallowed
    try:
        from starvecheck.cli import main
        from starvecheck.core import streams
        from starvecheck.stages.loader.factory import ending
    except KeyboardInterrupt:
        got.append(signal.SIGINT)
    except (MemoryError, ImportError, OSError) as e:  # under too small a ulimit -v
        try:
            from starvecheck.core.surroundings import limit_cause

            why = limit_cause(e)
        except MemoryError:  # not even that small module: said without it
            why = "out of memory as it started: raise the address-space limit (ulimit -v)"
        if why is None:
            raise
        sys.stderr.write(f"starvecheck: error: {why}\n")
        return 2
    finally:
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.unraisablehook = hook
    if got:
        sys.stderr.write("starvecheck: error: interrupted\n")
        return 130
    # Where the user's code ran in this process (`loader --factory`), the process ends
    # there once the report is written: nothing the pipeline left can hold it.
    ending.enable()
    streams.for_good()  # and a report on stdout stays whole to the end (core/streams.py)
    return ending.finish(main())
