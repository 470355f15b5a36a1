"""What every DataLoader worker starvecheck starts runs first (`worker_init_fn`), and
what the main process does before it starts any."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from starvecheck.core.signals import importing

# Workers hand each batch over through a Unix socket in that directory
# (`pymp-XXXXXXXX/listener-XXXXXXXX`), and a socket's path holds at most 107 bytes: a
# temporary directory longer than this leaves too little room, and every hand-over
# fails ("AF_UNIX path too long"). CPython 3.13 falls back to a short directory the
# same way (multiprocessing.util._get_base_temp_dir).
MAX_TEMP_DIR = 60

# The process that starts the workers, as `prepare_workers` found it: a worker forked
# from it inherits the figure (a worker started by spawn or forkserver is given it by
# its worker_init_fn, factory's ChainedInit).
_main_pid: int | None = None


def prepare_workers() -> None:
    """Before forking workers: make multiprocessing's temporary directory (pymp-*)
    here, once, so that every worker inherits it instead of making its own, which a
    worker that is stopped early leaves behind. This process removes it at exit. And
    this process's pid, which forked workers check as they start (`die_with_parent`)."""
    import tempfile
    from multiprocessing import util

    from starvecheck.scratch.directory import note_all

    base = tempfile.gettempdir()
    short = len(os.fsencode(base)) > MAX_TEMP_DIR and os.access("/tmp", os.W_OK | os.X_OK)
    saved = tempfile.tempdir
    if short:
        tempfile.tempdir = "/tmp"
    try:
        path = util.get_temp_dir()
    finally:
        tempfile.tempdir = saved
    # For `starvecheck clean`, should we be killed. clean removes it only as made here:
    # directly in the temporary directory or /tmp, named pymp-XXXXXXXX (scratch/claims.py).
    note_all({"pymp": path})
    global _main_pid
    _main_pid = os.getpid()


# `stop_workers(stuck=True)`: how long idle workers get to leave on their own before
# every worker still running is killed.
STUCK_GRACE_S = 1.0
# The same where the batches in flight are not wanted and each takes seconds (a slow
# configuration of `loader --factory`, read by when its batches were made): an idle
# worker leaves in milliseconds, and one in the middle of a batch would hold the
# shutdown for the rest of that batch (1.6 s at 100 ms a sample and batch 16).
HURRY_GRACE_S = 0.2


def stop_workers(it: object, stuck: bool = False, grace_s: float = STUCK_GRACE_S) -> None:
    """Shut a DataLoader iterator's workers down now, not at garbage collection (also
    on Ctrl-C), and kill any that torch's shutdown left running: a worker ignores the
    SIGTERM torch falls back on (worker_init), and one stuck (in Streaming's barrier,
    out of file descriptors) would hang multiprocessing's join at exit. `stuck`: the
    DataLoader delivered nothing in time (stages/dataloader/batches.py), so some worker will not
    read the request to stop; torch's shutdown would wait 5 s for each before killing
    it, so they are stopped first (`_kill_stuck`), after `grace_s`."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is None:  # num_workers=0
        return
    if stuck:
        _kill_stuck(it, grace_s)
    shutdown()
    for w in getattr(it, "_workers", ()):
        if w.is_alive():
            w.kill()
            w.join(timeout=5)


def _kill_stuck(it: Any, grace_s: float) -> None:
    """torch's own shutdown, in its order, with one short wait for all instead of 5 s
    per worker: the pin-memory thread first (a worker killed while handing a batch over
    could leave half a message it would wait on for good), the request to stop, then
    the workers' pids out of torch's SIGCHLD check (which raises "worker exited
    unexpectedly" in this process at a death it did not ask for), `grace_s` for
    the idle workers to leave, and SIGKILL for the rest. torch's `_shutdown_workers`
    then finds them gone and closes the queues. Private attributes of torch's iterator
    (stable since torch 1.x): where they are missing, or its pids are still watched,
    the work is left to `_shutdown_workers` at its own pace."""
    import contextlib

    from starvecheck.core import clocks

    with importing("torch"):
        from torch.utils.data import _utils

    # Not after torch's shutdown ran (a second call, its queues closed): kill only.
    with contextlib.suppress(AttributeError, OSError, ValueError):
        if not it._shutdown:
            if hasattr(it, "_pin_memory_thread"):
                it._pin_memory_thread_done_event.set()
                it._worker_result_queue.put((None, None))
                it._pin_memory_thread.join(timeout=2 * _utils.MP_STATUS_CHECK_INTERVAL)
            it._workers_done_event.set()
            for worker_id, running in enumerate(it._workers_status):
                if running:
                    it._mark_worker_as_unavailable(worker_id, shutdown=True)
    with contextlib.suppress(AttributeError):
        if it._worker_pids_set:
            _utils.signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
    if getattr(it, "_worker_pids_set", True):
        return
    workers = list(getattr(it, "_workers", ()))
    deadline = clocks.monotonic() + grace_s
    for w in workers:
        w.join(timeout=max(0.0, deadline - clocks.monotonic()))
    for w in workers:
        if w.is_alive():
            w.kill()
    for w in workers:
        w.join(timeout=5)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def prctl(option: int, value: int) -> None:
    """prctl(2) with one argument, on Linux; elsewhere, or where it fails, nothing."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def die_with_parent(parent: int | None, watched: bool = True) -> None:
    """A worker outlives a main process killed with SIGKILL (or by the OOM killer)
    while the worker starts: reparented, it waits for ever holding a copy of the
    dataset's memory, and multiprocessing's resource tracker with it (torch's watchdog
    reads the parent's pid only after worker_init_fn, so it watches the new parent).
    The kernel kills this worker when its parent goes (PR_SET_PDEATHSIG, Linux); where
    the parent went before that was set, `parent` (the main process's pid) is no
    longer this worker's parent nor running, and the worker leaves at once. Under
    forkserver the parent is the fork server, which outlives the main process while
    any worker holds its pipe: a thread of this worker watches the main process
    (`watched`: started here; False where it was started before, as the user's
    worker_init_fn's is followed by this call again, owndata.ChainedInit)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is None or parent == os.getpid() or os.getppid() == parent:
        return
    if not running(parent):
        os._exit(1)
    if not watched:
        return
    import threading

    threading.Thread(target=_watch, args=(parent,), name="starvecheck-parent", daemon=True).start()


# How often a worker whose parent is not the main process (forkserver) checks on it.
WATCH_S = 0.5


def _watch(parent: int) -> None:
    from starvecheck.core import clocks

    while running(parent):
        clocks.sleep(WATCH_S)
    os._exit(1)


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed but not yet reaped, does not)."""
    # Imported here: this module loads with every command (stages/base.py), /proc's
    # reader only where a worker watches its parent (start-up time and memory).
    from starvecheck.probe.process import own_stat

    read = own_stat(pid)
    if read is not None:
        return read.state not in ("Z", "X")
    try:  # gone, or its stat unreadable: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def worker_init(worker_id: int, parent: int | None = None) -> None:
    """First, the worker dies with the main process (`die_with_parent`; `parent`: its
    pid, else the one `prepare_workers` kept). Workers are forked while starvecheck
    turns signals into exceptions (the fork itself already set the handlers below:
    scratch/directory.py, `_child_after_fork`). SIGTERM and SIGHUP are ignored: sent to
    the whole process group (a closed terminal, systemd, Slurm's scancel, `kill --
    -PGID`) they reach the workers too, and a worker killed mid-batch leaves its shared
    memory behind and makes torch report the run as a failure; the main process, which
    got the same signal, shuts its workers down, and the parent-death signal ends a
    worker whose main process is gone. Ctrl-C, which torch handles in workers itself,
    ends them quietly. And when the main process stops early, a batch being handed over
    through multiprocessing's resource sharer meets a closed pipe in the worker:
    expected, so not printed as a traceback."""
    die_with_parent(parent if parent is not None else _main_pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    default = sys.excepthook

    def quiet(kind: type[BaseException], value: BaseException, tb: object) -> None:
        if issubclass(kind, (BrokenPipeError, ConnectionResetError, EOFError)):
            return
        default(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = quiet


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Warnings that are the point of the measurement, not news: more workers than
    CPUs (the sweep goes past them on purpose) and read-only arrays from MDS (the
    tensors are only counted). Forked workers inherit the filters."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*worker processes in total.*")
        warnings.filterwarnings("ignore", message=r".*NumPy array is not writable.*")
        yield
