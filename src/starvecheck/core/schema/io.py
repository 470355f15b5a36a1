"""io's parameters."""

from __future__ import annotations

from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import counts, flag, number, whole


class Parameters(Base):
    existing = flag()  # the user's own files (--existing), not generated ones
    threads = counts()  # the reader counts measured
    median_file_bytes = number()
    small_files_seen = whole(absent=0)  # --existing: files of at most 8 MiB among them
