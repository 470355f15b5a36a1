"""What every DataLoader worker starvecheck starts runs first (`worker_init_fn`), and
what the main process does before it starts any."""

from __future__ import annotations

import os
import signal
import sys

# Workers hand each batch over through a Unix socket in that directory
# (`pymp-XXXXXXXX/listener-XXXXXXXX`), and a socket's path holds at most 107 bytes: a
# temporary directory longer than this leaves too little room, and every hand-over
# fails ("AF_UNIX path too long"). CPython 3.13 falls back to a short directory the
# same way (multiprocessing.util._get_base_temp_dir).
MAX_TEMP_DIR = 60


def prepare_workers() -> None:
    """Before forking workers: make multiprocessing's temporary directory (pymp-*)
    here, once, so that every worker inherits it instead of making its own, which a
    worker that is stopped early leaves behind. This process removes it at exit."""
    import tempfile
    from multiprocessing import util

    from starvecheck.scratch import note_all

    base = tempfile.gettempdir()
    short = len(os.fsencode(base)) > MAX_TEMP_DIR and os.access("/tmp", os.W_OK | os.X_OK)
    saved = tempfile.tempdir
    if short:
        tempfile.tempdir = "/tmp"
    try:
        path = util.get_temp_dir()
    finally:
        tempfile.tempdir = saved
    note_all({"pymp": path})  # for `starvecheck clean`, should we be killed


def stop_workers(it: object) -> None:
    """Shut a DataLoader iterator's workers down now, not at garbage collection (also
    on Ctrl-C), and kill any that torch's shutdown left running: a worker ignores the
    SIGTERM torch falls back on (worker_init), and one stuck (in Streaming's barrier,
    out of file descriptors) would hang multiprocessing's join at exit."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is None:  # num_workers=0
        return
    shutdown()
    for w in getattr(it, "_workers", ()):
        if w.is_alive():
            w.kill()
            w.join(timeout=5)


def worker_init(worker_id: int) -> None:
    """Workers are forked while starvecheck turns signals into exceptions (the fork
    itself already set the handlers below: scratch.py, `_child_after_fork`). SIGTERM and
    SIGHUP are ignored: sent to the whole process group (a closed terminal, systemd,
    Slurm's scancel, `kill -- -PGID`) they reach the workers too, and a worker killed
    mid-batch leaves its shared memory behind and makes torch report the run as a
    failure; the main process, which got the same signal, shuts its workers down, and
    torch's watchdog ends a worker whose main process is gone. Ctrl-C, which torch
    handles in workers itself, ends them quietly. And when the main process stops early,
    a batch being handed over through multiprocessing's resource sharer meets a closed
    pipe in the worker: expected, so not printed as a traceback."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    default = sys.excepthook

    def quiet(kind: type[BaseException], value: BaseException, tb: object) -> None:
        if issubclass(kind, (BrokenPipeError, ConnectionResetError, EOFError)):
            return
        default(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = quiet
