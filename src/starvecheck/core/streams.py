"""Standard output kept for the report while the user's code runs in this process.

`loader --factory` (and doctor with a factory) import the user's FILE.py and run its
Dataset, sampler and collate_fn in starvecheck's own process and in the DataLoader's
workers. Whatever that code prints (Python's print, a C library's printf, a thread it
started that prints after FUNC returned, a forked worker) must not land in a report
written to stdout (`--json -`, `--markdown -`). So, as the user's code first runs,
`move` points fd 1 at stderr for the rest of the run, and keeps a duplicate of the
real stdout, which only starvecheck writes: the report (`report`), and a `--json
/dev/stdout` (`names_stdout`). sys.stdout stays the object it was (its writes reach
fd 1, now stderr); workers forked or spawned later inherit fd 1 as stderr too.

Where the command runs as a program (`for_good`: the console script), fd 1 stays on
stderr until the process ends (a daemon thread's late print cannot follow the report);
in a test's own process `put_back` restores it when the command returns. A stdout
that is no file descriptor (a StringIO in a test) is swapped for stderr at the Python
level only, and the report still goes to it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO


class _State:
    def __init__(self) -> None:
        self.for_good = False  # the console script: never put back
        self.original: TextIO | None = None  # sys.stdout when moved
        self.report: TextIO | None = None  # the saved real stdout (None: not moved)
        self.saved_fd = -1  # its descriptor; -1 where stdout is no descriptor
        self.moved = False


_state = _State()


def for_good() -> None:
    """The command runs as a program: once moved, fd 1 stays on stderr to the end."""
    _state.for_good = True


def move() -> None:
    """fd 1 (and sys.stdout's writes) to stderr; the real stdout kept for the report.
    Idempotent; a closed or unusable stdout is left alone (nothing to protect)."""
    if _state.moved:
        return
    stream = sys.stdout
    if stream is None or sys.stderr is None:
        return
    with contextlib.suppress(OSError, ValueError):
        stream.flush()
    fd = _fileno(stream)
    if fd != 1:  # no descriptor (a test's StringIO): Python's writes only
        _state.original, _state.report, _state.moved = stream, stream, True
        sys.stdout = sys.stderr
        return
    try:
        saved = os.dup(1)  # not inherited by a program a worker executes
    except OSError:
        return
    try:
        report = open(  # noqa: SIM115  # lives as long as the run
            saved,
            "w",
            encoding=getattr(stream, "encoding", None) or "utf-8",
            errors=getattr(stream, "errors", None) or "strict",
            closefd=True,
            newline=None,
        )
        os.dup2(2, 1)
    except (OSError, ValueError, LookupError):
        with contextlib.suppress(OSError):
            os.close(saved)
        return
    _state.original, _state.report, _state.saved_fd = stream, report, saved
    _state.moved = True


def put_back() -> None:
    """The real stdout on fd 1 again, where the command did not run as a program."""
    if not _state.moved or _state.for_good:
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    if _state.saved_fd >= 0:
        assert _state.report is not None
        with contextlib.suppress(OSError, ValueError):
            _state.report.flush()
        with contextlib.suppress(OSError):
            os.dup2(_state.saved_fd, 1)
        with contextlib.suppress(OSError, ValueError):
            _state.report.close()
    elif sys.stdout is sys.stderr:
        sys.stdout = _state.original
    _state.__init__()  # type: ignore[misc]
    _state.for_good = False


def report(stream: TextIO) -> TextIO:
    """Where a report meant for `stream` goes: the saved real stdout where `stream` is
    the stdout that was moved, else `stream` itself."""
    if _state.moved and _state.report is not None and stream is _state.original:
        return _state.report
    return stream


def stdout_fd() -> int:
    """The descriptor of the real stdout: the saved duplicate once moved, else 1."""
    return _state.saved_fd if _state.saved_fd >= 0 else 1


def flush() -> None:
    """The saved stdout flushed (before the process ends through os._exit)."""
    if _state.report is not None:
        with contextlib.suppress(Exception):
            _state.report.flush()


def names_stdout(path: str) -> bool:
    """Whether `path` names our fd 1 (/dev/stdout, /dev/fd/1, /proc/self/fd/1, or a
    link to one of them), once stdout was moved: the report then goes to the saved
    real stdout, not to what fd 1 is now. At most 40 links are followed."""
    if _state.saved_fd < 0:
        return False
    own = f"/proc/{os.getpid()}"
    for _ in range(40):
        head, tail = os.path.split(path)
        try:
            real_dir = os.path.realpath(head or ".")
        except (OSError, ValueError):
            return False
        if tail == "1" and _is_ours(real_dir, own):
            return True
        try:
            target = os.readlink(path)
        except (OSError, ValueError):
            return False
        path = os.path.join(real_dir, target)
    return False


def _is_ours(directory: str, own: str) -> bool:
    """/proc/PID/fd, or /proc/PID/task/TID/fd of one of our own threads."""
    if directory == f"{own}/fd":
        return True
    parts = directory[len(own) :].split("/")
    return directory.startswith(f"{own}/task/") and len(parts) == 4 and parts[3] == "fd"


def _fileno(stream: object) -> int:
    try:
        return int(stream.fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, TypeError):
        return -1
