"""The line of source a sampled frame names (`attach`): a `.to(device)` or an `.item()`
is C, not a Python frame, so the frame of the user's own code that calls it is read.
The path comes from another process's memory, so it is proved first: a regular file,
no larger than MAX_BYTES, read once and only read; py-spy's short names (`train.py`)
are looked up in the target's working directory alone.
"""

from __future__ import annotations

import os
import stat

MAX_BYTES = 1 << 20
MAX_FILES = 64


class Lines:
    """(file, line) -> the line's text, or None; each file read at most once."""

    def __init__(self, cwd: str | None = None) -> None:
        self.cwd = cwd
        self.files: dict[str, list[str] | None] = {}

    def __call__(self, file: str, line: int) -> str | None:
        if file not in self.files:
            self.files[file] = self._load(file) if len(self.files) < MAX_FILES else None
        lines = self.files[file]
        if lines is None or not 0 < line <= len(lines):
            return None
        return lines[line - 1]

    def _load(self, file: str) -> list[str] | None:
        if not os.path.isabs(file) and not self.cwd:
            return None
        path = os.path.join(self.cwd or "/", file)  # an absolute `file` stays as it is
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                return None
            with os.fdopen(os.dup(fd), "rb") as f:
                return f.read(MAX_BYTES).decode(errors="replace").splitlines()
        except OSError:
            return None
        finally:
            os.close(fd)
