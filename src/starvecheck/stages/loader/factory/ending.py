"""The user's code contained to the end of the process (`loader --factory`, doctor with
a factory), after `guard.guarding` is over: once the report is written, what the
pipeline's code left behind can no longer hold the process or change its status.

Python's own exit runs user code unbounded: it joins every non-daemon thread (a
prefetcher the factory started, a ThreadPoolExecutor task: the report is written, and
the process never ends), runs the exit handlers the pipeline registered (atexit) and
the __del__ of what is left. And a thread of the pipeline's may call os._exit at any
time, ending the run with its status (0: a CI gate passes) and no cleanup. So, where
the command runs as a program (`entry`, never in a test's own process), `arm` (as the
user's code first runs) puts a stand-in for os._exit in place for the rest of the
process's life, and `finish` (after the report) ends the process itself:

- a non-daemon thread started since `arm` and still running is named (its name and
  target) on stderr; nothing waits for it;
- the exit handlers (the pipeline's, then multiprocessing's, which remove its pymp-*
  directory and stop its daemonic processes) run in a thread of their own for at most
  EXIT_S; one that does not return is said, and the status is 2; multiprocessing's
  cleanup then runs (bounded) whatever they did, its directory removed if still there;
- os._exit called by the pipeline's code after the measurement (a daemon thread, an
  exit handler, a __del__) ends only the thread that called it, and the run ends in one
  line and exit 2, never 0; a forked DataLoader worker exits through the real os._exit;
- an exception that ends a thread of the pipeline's is one line, not its traceback;
- Ctrl-C, SIGTERM or SIGHUP while this runs ends it at once, with that signal's status
  and the same cleanup;
- then the real os._exit with the command's status, after flushing stdout and stderr:
  no module teardown, so no __del__ of the pipeline's objects at shutdown.

What remains possible: code that ends the process without os._exit (a C extension
calling _exit(2) or exit(3) directly, a signal sent to this process by itself, the
kernel's OOM killer) is not seen here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from starvecheck.core import clocks

# The most the exit handlers (the pipeline's and multiprocessing's) may take, and
# then multiprocessing's own cleanup again, each.
EXIT_S = 5.0


class _State:
    def __init__(self) -> None:
        self.enabled = False  # the command runs as a program (entry): finish may end it
        self.armed = False
        self.pid = 0
        self.where = "loader --factory"
        self.before: set[int] = set()  # threads running before the user's code
        self.real_exit: Callable[[int], Any] = os._exit
        self.exited: tuple[int, str] | None = None  # (status, thread) of a late os._exit
        self.signalled: int | None = None


_state = _State()


def enable() -> None:
    """The command runs as a program (`entry`): `finish` ends its process."""
    _state.enabled = True


def arm(where: str) -> None:
    """As the user's code is first run in this process: the threads running so far, and
    os._exit replaced for the rest of its life (`guard.guarding` sets its own stand-in
    over this one while it measures)."""
    if not _state.enabled or _state.armed:
        return
    _state.armed = True
    _state.pid = os.getpid()
    _state.where = where
    _state.before = {t.ident for t in threading.enumerate() if t.ident is not None}
    _state.real_exit = os._exit

    def _exit(status: int) -> None:
        if os.getpid() != _state.pid:  # a forked worker: its normal way out
            _state.real_exit(status)
        if _state.exited is None:
            _state.exited = (status, threading.current_thread().name)
        raise SystemExit(status)  # ends the thread that called it, quietly

    os._exit = _exit  # type: ignore[assignment]
    threading.excepthook = _thread_raised


def _thread_raised(args: Any) -> None:
    """A thread of the pipeline's that raised: one line, not its traceback (the thread
    is the pipeline's business; the run goes on without it)."""
    kind = getattr(args, "exc_type", None)
    if kind is None or issubclass(kind, SystemExit):
        return
    thread = getattr(getattr(args, "thread", None), "name", "?")
    try:
        text = " ".join(str(args.exc_value).split())[:200]
    except Exception:  # an exception whose __str__ raises
        text = ""
    _say("warning", f"{_state.where}: the pipeline's thread {thread!r} raised "
         f"{kind.__name__}{': ' + text if text else ''}")  # fmt: skip


def exited() -> tuple[int, str] | None:
    """(status, thread name) of an os._exit the pipeline's code called after the
    measurement, or None."""
    return _state.exited


def left_threads() -> list[threading.Thread]:
    """Non-daemon threads started since `arm` and still running: Python's exit would
    wait for each. None where not armed (in a test's own process)."""
    if not _state.armed:
        return []
    return [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread()
        and not t.daemon
        and t.is_alive()
        and t.ident not in _state.before
        and not t.name.startswith("starvecheck-")
    ]


def describe(t: threading.Thread) -> str:
    target = getattr(t, "_target", None)
    if target is None:
        return f"{t.name!r}"
    name = getattr(target, "__qualname__", None) or type(target).__name__
    module = getattr(target, "__module__", None)
    return f"{t.name!r}, target {module + '.' if module else ''}{name}"


def finish(code: int) -> int:
    """After the command: where the user's code ran in this process (`arm`), end it as
    the module's docstring says, with `code` or the status the pipeline's code earned;
    else return `code`."""
    if not _state.armed or os.getpid() != _state.pid:
        return code
    stop = threading.Event()

    def caught(signum: int, frame: object) -> None:
        if _state.signalled is None:
            _state.signalled = signum
        stop.set()

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(s, caught)
    threads = left_threads()
    if threads:
        shown = "; ".join(describe(t) for t in threads[:8]) + ("; ..." if len(threads) > 8 else "")
        _say(
            "warning",
            f"{_state.where}: the pipeline's code left {len(threads)} thread(s) running "
            f"({shown}): starvecheck ends without waiting for them",
        )
    sys.unraisablehook = _unraisable
    _flush()
    import atexit

    returned = _bounded(atexit._run_exitfuncs, stop, "starvecheck-exit")
    if not returned and _state.signalled is None:
        _say("error", f"{_state.where}: the pipeline's exit handlers (atexit) did not "
             f"return in {EXIT_S:.0f} s: not waited for")  # fmt: skip
        code = 2 if code in (0, 1) else code
    _cleanup(stop)
    if _state.signalled is not None:
        name = signal.Signals(_state.signalled).name
        _say("error", "interrupted" if name == "SIGINT" else f"terminated by {name}")
        code = 128 + _state.signalled
    elif _state.exited is not None and code in (0, 1):
        status, thread = _state.exited
        _say(
            "error",
            f"{_state.where}: the pipeline's code called os._exit({status}) in thread "
            f"{thread!r} after the measurement: the run's status is not the pipeline's to "
            "set",
        )
        code = 2
    _flush()
    _state.real_exit(code)
    return code  # not reached


def _bounded(work: Callable[[], Any], stop: threading.Event, name: str) -> bool:
    """work() in a daemon thread, waited for at most EXIT_S (less after a signal):
    whether it returned."""
    done = threading.Event()

    def run() -> None:
        try:
            work()
        except BaseException:  # the pipeline's handlers: said by the hook
            pass
        finally:
            done.set()

    try:
        threading.Thread(target=run, name=name, daemon=True).start()
    except RuntimeError:  # "can't start new thread" (ulimit -v, -u): here, as Python would
        run()
        return True
    deadline = clocks.monotonic() + EXIT_S
    while not done.is_set() and not stop.is_set() and clocks.monotonic() < deadline:
        done.wait(0.05)
    return done.is_set()


def _cleanup(stop: threading.Event) -> None:
    """multiprocessing's own exit (its finalizers: the pymp-* directory; its daemonic
    processes stopped), bounded; whatever is left of either then removed or killed."""
    import shutil
    from multiprocessing import process, util

    tempdir = process.current_process()._config.get("tempdir")  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        util._exiting = False  # type: ignore[attr-defined]  # run again, the handlers cut short
    again = threading.Event() if stop.is_set() else stop
    _bounded(util._exit_function, again, "starvecheck-mp")  # type: ignore[attr-defined]
    for child in process.active_children():
        with contextlib.suppress(Exception):
            child.kill()
    if tempdir and os.path.isdir(tempdir):
        shutil.rmtree(tempdir, ignore_errors=True)


def _unraisable(info: Any) -> None:
    """An exception in an exit handler or a __del__ of the pipeline's: one line."""
    what = getattr(info, "exc_type", None)
    if what is None or issubclass(what, SystemExit):
        return
    text = " ".join(str(getattr(info, "exc_value", "") or "").split())[:200]
    _say("warning", f"{_state.where}: the pipeline's code raised {what.__name__}"
         f"{': ' + text if text else ''} at exit (ignored)")  # fmt: skip


def _say(kind: str, line: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"starvecheck: {kind}: {line}\n")


def _flush() -> None:
    from starvecheck.core import streams

    streams.flush()  # the report's stdout, where the user's code moved fd 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
