"""The user's code running in starvecheck's own process (`loader --factory`): what it
may change of the process that starvecheck relies on, put back after each call into it,
and what it may hand back that cannot be measured, refused (docs/architecture.md,
principle 7).

Importing FILE.py and calling FUNC, and then every batch read with num_workers=0 (the
dataset, the sampler, the collate_fn), run the user's code in this process. Such code
may, on purpose or as a side effect of a library:

- change the working directory or the umask: put back after each call (`user_code`),
  said once on stderr; the outputs and the factory's file were made absolute before
  any of it ran;
- set its own handler of SIGINT, SIGTERM or SIGHUP, which would switch off
  starvecheck's (core/signals.signals_raise: Ctrl-C and SIGTERM stop the workers and
  remove what was made), or of SIGALRM with a real-time timer (ITIMER_REAL), which
  would switch off --batch-timeout and --factory-timeout (stages/dataloader/batches.py
  leaves a timer someone else has running alone): while `guarding`, signal.signal for
  those four, signal.setitimer(ITIMER_REAL) and signal.alarm called by anything but
  starvecheck's own code in this process do nothing (said once), whichever thread
  calls them, so that a SIG_IGN set inside a batch cannot drop a SIGTERM; what is
  changed another way (a C extension, signal.pthread_sigmask) is put back after each
  call: the handlers, the signal mask, a timer the call left running cancelled (or,
  where ours was running, ours armed again with the time it had left);
- call os._exit in this process, which would end the run with the user's status (0: a
  CI gate passes) and skip every cleanup: while `guarding`, os._exit in this process
  raises instead, and the run ends in one line and exit 2 even where the user's code
  catches that. A forked DataLoader worker, another process, exits through the real
  os._exit as it always does.

A batch that is None, or holds nothing (a collate_fn that returns None or an empty
list), is refused by `empty_batch`: it would be read as the end of the epoch, or as a
batch of samples, and the run would report figures of nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.signals import in_main_thread, received
from starvecheck.core.status import UsageError
from starvecheck.stages.loader.factory.ending import arm
from starvecheck.stages.loader.factory.owndata import SampleFailed, worker_error

# The handlers starvecheck keeps while the user's code runs: signals_raise's, and the
# time limits' SIGALRM (with the timer, ITIMER_REAL).
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)


def _ours() -> bool:
    """Whether signal.signal, setitimer or alarm was called by starvecheck's own code
    (three frames up: past `refused` and the stand-in), not by the user's."""
    name = sys._getframe(3).f_globals.get("__name__", "")
    return name == "starvecheck" or name.startswith("starvecheck.")


class _Guard:
    def __init__(self, where: str, warn: Callable[[str], None]) -> None:
        self.where = where
        self.warn = warn
        self.pid = os.getpid()
        try:
            self.cwd: str | None = os.getcwd()
        except OSError:  # removed before the run began: nothing to go back to
            self.cwd = None
        self.said: set[str] = set()
        self.umask = os.umask(0o077)  # read by setting it: put back at once
        os.umask(self.umask)
        self.exited: int | None = None  # the status the user's code gave os._exit

    def say(self, kind: str, message: str) -> None:
        if kind not in self.said:
            self.said.add(kind)
            self.warn(f"{self.where}: {message}")

    def exit_error(self) -> UsageError:
        return UsageError(
            f"{self.where}: the pipeline's code called os._exit({self.exited}) in "
            "starvecheck's own process (FUNC, the dataset, the sampler or the collate_fn "
            "with num_workers=0): the run ends here, not measured"
        )

    def restore(
        self, handlers: dict[int, Any], timer: tuple[float, float], t0: float, mask: set[int]
    ) -> None:
        self._restore_cwd()
        self._restore_umask()
        changed = []
        if signal.pthread_sigmask(signal.SIG_BLOCK, ()) != mask:  # a SIGTERM held, delivered
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            changed.append("signal mask")
        # After a signal, signals_raise ignores any further one while the run unwinds:
        # its own change, kept.
        for s, before in handlers.items() if received() is None else ():
            now = signal.getsignal(s)
            if before is not None and now != before:
                signal.signal(s, before)
                changed.append(signal.Signals(s).name)
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        if timer[0] > 0:  # ours was running: armed again with the time it had left
            left = max(0.001, timer[0] - (clocks.monotonic() - t0))
            if remaining <= 0 or abs(remaining - left) > 0.05:
                signal.setitimer(signal.ITIMER_REAL, left, timer[1])
                changed.append("ITIMER_REAL")
        elif remaining > 0:  # the user's own, left running
            signal.setitimer(signal.ITIMER_REAL, 0)
            changed.append("ITIMER_REAL")
        if changed:
            self.say(
                "signals",
                f"the pipeline's code set its own {', '.join(changed)} (its signal handlers "
                "or timer): starvecheck put its own back, so that Ctrl-C, SIGTERM and "
                "--batch-timeout still stop the run",
            )

    def _restore_umask(self) -> None:
        """A umask the user's code set would make the report (--json) and what
        starvecheck writes unreadable (0o777), or readable by all (0)."""
        then = os.umask(self.umask)
        if then != self.umask:
            self.say("umask", f"the pipeline's code set the umask to {then:03o}: starvecheck "
                     f"put its {self.umask:03o} back after each call into it")  # fmt: skip

    def _restore_cwd(self) -> None:
        try:
            now: str | None = os.getcwd()
        except OSError:  # the directory it moved to is gone
            now = None
        if self.cwd is None or now == self.cwd:
            return
        try:
            os.chdir(self.cwd)
        except OSError as e:
            self.say("cwd", f"the pipeline's code left the working directory, and {self.cwd} "
                     f"cannot be entered again ({e.strerror})")  # fmt: skip
            return
        self.say(
            "cwd",
            f"the pipeline's code changed the working directory (to {now or 'a removed one'}): "
            f"starvecheck changed it back to {self.cwd} after each call into it",
        )


_current: list[_Guard] = []


@contextlib.contextmanager
def guarding(where: str, warn: Callable[[str], None]) -> Iterator[None]:
    """While the user's pipeline is loaded and read in this process: os._exit here
    raises, and `user_code` puts back what each call changed. `where` begins every line
    ("loader --factory SPEC")."""
    if not in_main_thread() or _current:
        yield
        return
    guard = _Guard(where, warn)
    arm(where)  # os._exit contained after this, too, to the process's end (ending.py)

    def _exit(status: int) -> None:
        # A forked worker: its normal way out. After `guarding` (this stand-in kept by
        # the user's code, atexit.register(os._exit, 0)): the stand-in it replaced.
        if os.getpid() != guard.pid or guard not in _current:
            real_exit(status)
            return
        if guard.exited is None:
            guard.exited = status
        if not in_main_thread():  # a thread of the pipeline's: it ends, quietly; the
            raise SystemExit(status)  # run ends at the next call into the user's code
        raise guard.exit_error()

    def refused(what: str) -> bool:
        # The user's code (FUNC, a sample, a thread of theirs), not starvecheck's own,
        # in this process: a SIG_IGN set inside a call would drop a SIGTERM before
        # `restore` runs, and a timer of theirs armed while a batch is read would put
        # --batch-timeout off for as long as they like.
        if os.getpid() != guard.pid or _ours():
            return False
        guard.say(
            what,
            f"the pipeline's code set its own {what}: starvecheck kept its own, so that "
            "Ctrl-C, SIGTERM and --batch-timeout still stop the run",
        )
        return True

    def _signal(signum: int, handler: Any) -> Any:
        if signum in HANDLED and refused(f"{signal.Signals(signum).name} handler"):
            return signal.getsignal(signum)
        return real["signal"](signum, handler)

    def _setitimer(which: int, seconds: float, interval: float = 0.0) -> Any:
        if which == signal.ITIMER_REAL and refused("timer (ITIMER_REAL)"):
            return signal.getitimer(which)
        return real["setitimer"](which, seconds, interval)

    def _alarm(seconds: int) -> int:
        if refused("timer (ITIMER_REAL)"):
            return round(signal.getitimer(signal.ITIMER_REAL)[0])
        return real["alarm"](seconds)

    real = {"signal": signal.signal, "setitimer": signal.setitimer, "alarm": signal.alarm}
    real_exit = os._exit
    os._exit = _exit  # type: ignore[assignment]
    signal.signal, signal.setitimer, signal.alarm = _signal, _setitimer, _alarm  # type: ignore[assignment]
    _current.append(guard)
    try:
        yield
    finally:
        os._exit = real_exit  # type: ignore[assignment]
        signal.signal, signal.setitimer, signal.alarm = real.values()  # type: ignore[assignment]
        _current.clear()
    if guard.exited is not None:  # the user's code caught what os._exit raised
        raise guard.exit_error()


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Around one call into the user's code (outside `guarding`: nothing is done)."""
    if not _current or not in_main_thread():
        yield
        return
    guard = _current[0]
    handlers = {s: signal.getsignal(s) for s in HANDLED}
    timer = signal.getitimer(signal.ITIMER_REAL)
    t0 = clocks.monotonic()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        yield
    finally:
        guard.restore(handlers, timer, t0, mask)
    if guard.exited is not None:
        raise guard.exit_error()


@contextlib.contextmanager
def recorded() -> Iterator[None]:
    """Where no scratch directory of this run is live (doctor has one; `loader
    --factory` writes nothing else): one in the temporary directory, holding only its
    marker, so that what the run makes outside it (multiprocessing's pymp-*,
    stages/dataloader/workers.prepare_workers) is recorded, and `starvecheck clean
    $TMPDIR` removes it after a kill. Where none can be made there, the run goes on."""
    import tempfile

    from starvecheck.scratch.directory import Scratch, recording

    if recording():
        yield
        return
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError, UsageError):
            # No line about killed runs' directories there: the temporary directory is
            # not the user's PATH, and docs/commands/clean.md says how to remove them.
            stack.enter_context(Scratch(tempfile.gettempdir(), prefix="starvecheck-factory-"))
        yield


def empty_batch(batch: Any) -> str | None:
    """What is wrong with a batch that holds nothing to measure, or None: None itself, an
    empty list, tuple, dict or string, a tensor or array of no elements."""
    if batch is None:
        return "is None (a collate_fn that returns nothing?)"
    if isinstance(batch, list | tuple | dict | str | bytes) and len(batch) == 0:
        return f"is an empty {type(batch).__name__}"
    if _no_elements(batch):
        return f"is a {type(batch).__name__} of shape {tuple(batch.shape)}: no elements"
    fields = list(batch.values()) if isinstance(batch, dict) else batch
    if isinstance(fields, list | tuple) and all(map(_no_elements, fields)):
        return f"holds only tensors or arrays of no elements ({len(fields)} of them)"
    return None


def _no_elements(item: Any) -> bool:
    """A tensor or array of shape with a 0 in it; what has no readable shape (a nested
    tensor's raises, a custom object's may be anything) is not refused here."""
    try:
        shape = getattr(item, "shape", None)
        return isinstance(shape, tuple) and any(type(n) is int and n == 0 for n in shape)
    except Exception:
        return False


def next_batch(it: Any, where: str, index: int) -> Any:
    """The next batch of `it`, a call into the user's code; None at the end of the
    epoch. A sample that raises (in this process or a worker) is one line naming the
    sample and the exception; anything else that fails (a collate_fn, a sampler, a
    sys.exit in one) names the batch; a batch of nothing (`empty_batch`) too."""
    try:
        with user_code():
            batch = next(it)
    except StopIteration:
        return None
    except UsageError:
        raise
    except (Exception, SystemExit) as e:
        at = "" if isinstance(e, SampleFailed) else f"batch {index}: "
        raise UsageError(f"{where}: {at}{worker_error(e)}") from e
    try:
        wrong = empty_batch(batch)
    except Exception:  # a batch of the user's own class, whose __len__ or __iter__ raises
        wrong = None  # is not refused as empty: the figures say what could be read
    if wrong is not None:
        raise UsageError(f"{where}: batch {index} {wrong}: there is nothing to measure")
    return batch
