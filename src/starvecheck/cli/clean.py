"""`starvecheck clean PATH`: what killed runs left behind, and only that."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from starvecheck.cli.common import app, context_of
from starvecheck.core import surroundings
from starvecheck.core.status import UsageError
from starvecheck.core.text import printable


@app.command()
def clean(
    ctx: typer.Context,
    path: Annotated[
        str,
        typer.Argument(
            help="The directory a killed run measured in (its PATH).", show_default=False
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")
    ] = False,
) -> int:
    """Remove the scratch directories of starvecheck runs that were killed (SIGKILL, an
    out-of-memory kill) in PATH, with the shared memory and lock files their markers
    name.

    A directory is removed only when its marker proves it is starvecheck's (a file of
    yours, same owner) and that the process that made it is gone; others are listed
    with the reason (still running, made on another host, no marker). What a marker
    names outside PATH is removed only where it is exactly what starvecheck makes there
    (multiprocessing's pymp-* directory and Streaming's blocks and lock files in the
    temporary directory, /dev/shm), yours, and used by no process; anything else is
    refused and listed. Nothing else is touched.
    """
    from starvecheck.scratch import leftovers, reclaim

    c = context_of(ctx)
    surroundings.check_relative(path, path)
    target = os.path.realpath(path)
    if not os.path.isdir(target):
        raise UsageError(
            f"{path}: {'not a directory' if os.path.lexists(target) else 'no such directory'}"
        )
    try:
        found = leftovers.scan(target)
    except OSError as e:
        # Unreadable (no read permission on PATH): saying there is nothing would be false.
        raise UsageError(f"{path}: cannot list the directory: {e.strerror}") from e
    removed: list[str] = []
    left: list[str] = []
    for x in found:
        done = reclaim.remove(x, environ=c.environ, dry_run=dry_run)
        removed += done.removed
        left += done.left
    verb = "would remove" if dry_run else "removed"
    # Names come from PATH and from markers anyone who can write there wrote: escaped.
    for p in removed:
        c.stdout.write(f"{verb} {printable(p)}\n")
    for p in left:
        c.stdout.write(f"left   {printable(p)}\n")
    if not found:
        c.stdout.write(f"no starvecheck scratch directories in {printable(target)}\n")
    c.stdout.flush()
    return 0
