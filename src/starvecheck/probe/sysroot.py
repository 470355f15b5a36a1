"""The one root prefix for every read of /proc, /sys, the mount table and marker files.

`STARVECHECK_SYSROOT` (default `/`) points probes at a fake machine: a directory
tree that mirrors real paths. Tests use it with the trees in
tests/fixtures/sysroots/; people can use it to check a copy of another machine.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from starvecheck.probe.fact import Fact

ENV_VAR = "STARVECHECK_SYSROOT"

# Files under /proc and /sys are small; a cap keeps a garbled or special file
# (a multi-gigabyte file in a fake tree) from flooding a probe.
MAX_READ_BYTES = 4 * 1024 * 1024
# Read in chunks: some proc files (/proc/sys/*) fail with ENOMEM when asked for
# one read as large as the cap.
CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class SysRoot:
    root: Path

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> SysRoot:
        value = (environ if environ is not None else os.environ).get(ENV_VAR, "") or "/"
        return cls(Path(value))

    @property
    def real(self) -> bool:
        """True when probes read this machine (so statvfs, rlimits and NVML apply)."""
        return self.root.resolve() == Path("/")

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def exists(self, path: str) -> bool:
        try:
            return self.path(path).exists()
        except OSError:
            return False

    def read(self, path: str) -> Fact[str]:
        """The text of a file, or unknown with the reason (missing, unreadable, not a
        regular file: a FIFO or a device planted in a fake machine's tree is never read,
        nor waited on; /proc's and /sys's files are regular)."""
        full = self.path(path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with open(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return Fact.unknown(f"{path} is not a regular file")
                data = _read_capped(f)
        except FileNotFoundError:
            return Fact.unknown(f"{path} does not exist")
        except IsADirectoryError:
            return Fact.unknown(f"{path} is a directory")
        except PermissionError:
            return Fact.unknown(f"no permission to read {path}")
        except OSError as e:
            return Fact.unknown(f"cannot read {path}: {e.strerror or e}")
        return Fact.of(data.decode("utf-8", errors="replace"))

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(path)))
        except OSError:
            return []

    def readlink(self, path: str) -> Fact[str]:
        try:
            return Fact.of(os.readlink(self.path(path)))
        except OSError as e:
            return Fact.unknown(f"cannot read link {path}: {e.strerror or e}")


def _read_capped(f) -> bytes:
    parts: list[bytes] = []
    size = 0
    while size < MAX_READ_BYTES:
        chunk = f.read(min(CHUNK_BYTES, MAX_READ_BYTES - size))
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)
