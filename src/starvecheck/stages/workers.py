"""What every DataLoader worker starvecheck starts runs first (`worker_init_fn`)."""

from __future__ import annotations

import signal
import sys


def worker_init(worker_id: int) -> None:
    """Workers are forked while starvecheck turns SIGTERM and SIGHUP into exceptions;
    in a worker those would print tracebacks, so workers get the defaults back (torch
    handles Ctrl-C in workers itself). And when the main process stops early, a batch
    being handed over through multiprocessing's resource sharer meets a closed pipe
    in the worker: expected, so not printed as a traceback."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    default = sys.excepthook

    def quiet(kind: type[BaseException], value: BaseException, tb: object) -> None:
        if issubclass(kind, (BrokenPipeError, ConnectionResetError, EOFError)):
            return
        default(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = quiet
