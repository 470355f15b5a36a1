"""A real pids cgroup (v1) for tests that need a pids limit: made where this process may
make one (root, a writable hierarchy), removed once its tasks are gone."""

from __future__ import annotations

import os
import time
from pathlib import Path

BASE = Path("/sys/fs/cgroup/pids")


def pids_cgroup(tmp_path: Path, limit: int | None = None) -> Path | None:
    """A child pids cgroup, limited to `limit` tasks where given; None where none can
    be made here."""
    if not (BASE / "cgroup.procs").exists() or not os.access(BASE, os.W_OK):
        return None
    cg = BASE / f"starvecheck-test-{os.getpid()}-{tmp_path.name}"
    try:
        cg.mkdir()
        if limit is not None:
            (cg / "pids.max").write_text(str(limit))
    except OSError:
        return None
    return cg


def remove(cg: Path, within_s: float = 5.0) -> None:
    """Remove the cgroup once its last task has left (within `within_s`)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.1)
