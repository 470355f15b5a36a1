"""Where `watch` writes its report, and the rule that writing it never breaks the loop.

A `file=` that cannot take text (a path given as a string, a closed file, one open for
reading, a binary file) is the caller's mistake, refused when the watch is made, before
the loop starts: one TypeError or ValueError saying what to pass. A file that fails
later (a full disk, /dev/full, a pipe whose reader left, a file closed meanwhile) and
any failure of starvecheck's own while it reports are one warning line on stderr, once
per watch: the report is lost, the loop goes on, and an exception the loop is already
raising stays the one it raises.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator

USE = "sys.stdout, sys.stderr or open(path, 'w')"


def check_file(file: object) -> None:
    """Refuse a `file=` that can never take the report; None is stderr."""
    if file is None:
        return
    if isinstance(file, str | bytes | os.PathLike):
        raise TypeError(f"file must be an open text stream ({USE}), not the path {file!r}")
    if not callable(getattr(file, "write", None)):
        raise TypeError(f"file must be an open text stream ({USE}), not {type(file).__name__}")
    if isinstance(file, io.RawIOBase | io.BufferedIOBase):
        raise TypeError(f"file is open in binary mode ({_name(file)}): open it with mode 'w'")
    if problem := _not_writable(file):
        raise ValueError(f"file {problem}: pass {USE}")


def _not_writable(file: object) -> str | None:
    """Why a text stream cannot take the report now, or None (also where it cannot say:
    the write will tell)."""
    try:
        if getattr(file, "closed", False) is True:
            return f"is closed ({_name(file)})"
        writable = getattr(file, "writable", None)
        if callable(writable) and writable() is False:
            mode = getattr(file, "mode", None)
            opened = f", opened with mode {mode!r}" if isinstance(mode, str) else ""
            return f"is not open for writing ({_name(file)}{opened})"
    except Exception:
        pass
    return None


def _name(file: object) -> str:
    name = getattr(file, "name", None)
    return repr(name) if isinstance(name, str | int) else type(file).__name__


@contextlib.contextmanager
def never_raising(warned: set[str], what: str) -> Iterator[None]:
    """Run starvecheck's own work beside the user's loop: an Exception in it is one
    warning line on stderr (the first of each `what` in `warned`), never raised.
    KeyboardInterrupt and SystemExit go through: they are the user's."""
    try:
        yield
    except Exception as e:
        if what in warned:
            return
        warned.add(what)
        why = " ".join(str(e).split())
        why = why if len(why) <= 200 else why[:197] + "..."
        line = f"starvecheck: warning: watch could not {what} ({type(e).__name__}: {why}); "
        line += "the loop goes on\n"
        with contextlib.suppress(Exception):  # stderr itself may be what failed
            sys.stderr.write(line)
            sys.stderr.flush()
