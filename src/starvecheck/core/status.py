"""Exit statuses, and the errors that carry one.

Every error that reaches the user becomes one line and one of these codes in
`cli.main`; nothing else decides an exit status.
"""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    OK = 0  # ran, and nothing at or above --fail-on
    FINDINGS = 1  # findings at or above --fail-on
    USAGE = 2  # bad usage or input
    UNAVAILABLE = 3  # the stage cannot run here (no CUDA device, ...)
    INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
    HANGUP = 129  # SIGHUP (a closed terminal), as shells report 128 + 1
    TERMINATED = 143  # SIGTERM, as shells report 128 + 15


def signal_status(signum: int) -> ExitStatus:
    """The status a shell reports for a process ended by this signal."""
    return ExitStatus(128 + signum)


class StarvecheckError(Exception):
    """An error meant for the user: `str(error)` is the whole message."""

    status = ExitStatus.USAGE


class UsageError(StarvecheckError):
    status = ExitStatus.USAGE


class Unavailable(StarvecheckError):
    status = ExitStatus.UNAVAILABLE


class BatchTimeout(UsageError):
    """A DataLoader delivered no batch within --batch-timeout (stages/dataloader/batches.py): a
    stuck worker or dataset is bad input, exit 2. Not `Unavailable`, which doctor
    records for the stage and goes on: the run ends here."""
