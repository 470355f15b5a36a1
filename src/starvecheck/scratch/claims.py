"""What a dead run's marker names outside its directory, each proven by name and place
or refused (scratch/reclaim.py removes what is proven, once it has checked the files).

A marker is written by whoever can write in PATH, so a path it names counts only where
it matches exactly what starvecheck itself makes, in the place it makes it:

- multiprocessing's temporary directory (stages/dataloader/workers.py, `prepare_workers`): an
  absolute path whose parent is the temporary directory (TMPDIR, as tempfile chooses
  it) or /tmp, named `pymp-` and 8 of tempfile's random characters
  (multiprocessing.util.get_temp_dir: `tempfile.mkdtemp(prefix="pymp-")`);
- Streaming's blocks and lock files of a prefix (stages/samples/mds.py, `marker_line`):
  `/dev/shm/NNNNNN_NAME`, NAME one of the names Streaming gives its blocks, and
  `NNNNNN_barrier_filelock`, `NNNNNN_cache_filelock` in the temporary directory
  Streaming uses (this TMPDIR: never a directory the marker names); all only while
  the prefix is still the run's (its `locals` block gone, or one of the caller's
  naming a directory inside the run's directory: Streaming hands a prefix out again
  only once that block is gone).

Anything else (a relative path, a path elsewhere, a name not on the list, a line this
version does not write) is refused, with why.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starvecheck.scratch.leftovers import MARKER_FLAGS, Leftover

SHM_DIR = "/dev/shm"
# streaming.base.constant.SHM_TO_CLEAN, and its lock files (BARRIER_FILELOCK,
# CACHE_FILELOCK); tests/test_clean_hostile.py checks them against the installed package.
SHM_NAMES = frozenset(
    {
        "locals",
        "barrier",
        "next_epoch",
        "cache_usage",
        "shard_states",
        "shard_access_times",
        "resume",
        "epoch_shape",
        "epoch_data",
    }
)
FILELOCK_NAMES = frozenset({"barrier_filelock", "cache_filelock"})
LOCALS = "locals"  # Streaming hands a prefix out again once this block is gone
MAX_PREFIX = 10**6  # prefixes are written with 6 digits
# tempfile._RandomNameSequence: 8 of "abcdefghijklmnopqrstuvwxyz0123456789_".
_RANDOM = "[a-z0-9_]{8}"
PYMP_NAME = re.compile(f"pymp-{_RANDOM}")  # multiprocessing.util.get_temp_dir
LISTENER_NAME = re.compile(f"listener-{_RANDOM}")  # connection.arbitrary_address
ARENA_NAME = re.compile(f"pym-[0-9]+-{_RANDOM}")  # heap.Arena, when /dev/shm is full
SHOWN_CHARS = 200  # of a marker value, as a refusal shows it


@dataclass(frozen=True)
class Target:
    """A path a marker line names that matches what starvecheck makes there."""

    kind: str  # "pymp", "shm" or "lock"
    directory: str
    name: str
    group: str = ""  # the Streaming prefix it belongs to

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)


@dataclass(frozen=True)
class Refused:
    path: str
    why: str
    group: str = ""


def temp_dir(environ: Mapping[str, str]) -> str:
    """The directory tempfile.gettempdir() gives a process run with `environ`: where
    Streaming puts its lock files and multiprocessing its pymp-* directory."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = environ.get(name)
        if value and os.path.isdir(value) and os.access(value, os.W_OK | os.X_OK):
            return os.path.abspath(value)
    for value in ("/tmp", "/var/tmp", "/usr/tmp"):
        if os.path.isdir(value) and os.access(value, os.W_OK | os.X_OK):
            return value
    return os.path.abspath(os.curdir)


def plan(x: Leftover, tmp: str) -> list[Target | Refused]:
    """What each line of a dead run's marker names, each proven by name and place, or
    refused with why (nothing here touches the filesystem but the `locals` block)."""
    items: list[Target | Refused] = []
    for extra in x.extras:
        if "pymp" in extra:
            items.append(_pymp_target(extra["pymp"], tmp))
        elif "streaming_prefix" in extra:
            items += _streaming_targets(extra, x.path, tmp)
        else:
            items.append(Refused(_shown(extra), "a marker line starvecheck does not write"))
    return items


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def _cut(path: str) -> str:
    """A path as a refusal shows it: a marker may name one of 64 KiB."""
    return path if len(path) <= SHOWN_CHARS else path[:SHOWN_CHARS] + "..."


def _pymp_target(value: Any, tmp: str) -> Target | Refused:
    if not isinstance(value, str):
        return Refused(f"pymp {_shown(value)}", "not a path")
    if not os.path.isabs(value) or os.path.normpath(value) != value:
        return Refused(_cut(value), "not an absolute path in its plain form")
    parent, name = os.path.split(value)
    if parent not in (tmp, "/tmp"):
        return Refused(
            _cut(value),
            f"not in the temporary directory ({tmp}) or /tmp, where multiprocessing makes "
            "its directory (run clean with the TMPDIR the run had)",
        )
    if not PYMP_NAME.fullmatch(name):
        why = "not a name multiprocessing gives its directory (pymp-XXXXXXXX)"
        return Refused(_cut(value), why)
    return Target("pymp", parent, name)


def _streaming_targets(extra: dict[str, Any], scratch: str, tmp: str) -> list[Target | Refused]:
    prefix = extra.get("streaming_prefix")
    if prefix is None:  # the dataset never held a prefix: it made nothing
        return []
    if type(prefix) is not int or not 0 <= prefix < MAX_PREFIX:
        return [Refused(f"streaming_prefix {_shown(prefix)}", "not a prefix Streaming hands out")]
    group = f"{prefix:06}"
    items: list[Target | Refused] = []
    for name in _listed(extra.get("shm_names")):
        if isinstance(name, str) and name in SHM_NAMES:
            items.append(Target("shm", SHM_DIR, f"{group}_{name}", group))
        else:
            why = "not a name Streaming gives its shared memory"
            items.append(Refused(_named(SHM_DIR, group, name), why, group))
    root = extra.get("filelock_root")
    where = root if isinstance(root, str) else _shown(root)
    for name in _listed(extra.get("filelock_names")):
        if not isinstance(name, str) or name not in FILELOCK_NAMES:
            why = "not a name Streaming gives its lock files"
            items.append(Refused(_named(where, group, name), why, group))
        elif root != tmp:
            why = (
                f"not in the temporary directory Streaming uses ({tmp}); run clean with the "
                "TMPDIR the run had"
            )
            items.append(Refused(_named(where, group, name), why, group))
        else:
            items.append(Target("lock", tmp, f"{group}_{name}", group))
    held = _prefix_taken(prefix, scratch)
    if held is None:
        return items
    return [Refused(i.path, held, group) if isinstance(i, Target) else i for i in items]


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def _named(where: str, group: str, name: Any) -> str:
    return _cut(os.path.join(where, f"{group}_{name if isinstance(name, str) else _shown(name)}"))


def locals_dirs(data: bytes) -> list[str] | None:
    """The local directories a Streaming `locals` block lists (streaming.base.shared.
    prefix._pack_locals: a native int32 size, then the directories and the prefix
    joined by NUL), or None where it is not one."""
    if len(data) < 4:
        return None
    size = int.from_bytes(data[:4], sys.byteorder, signed=True)
    if not 4 <= size <= len(data):
        return None
    try:
        parts = data[4:size].decode("utf-8").split("\0")
    except UnicodeDecodeError:
        return None
    return parts[:-1]


def _prefix_taken(prefix: int, scratch: str) -> str | None:
    """Why `prefix` is no longer the dead run's, or None while it is: Streaming hands a
    prefix out again only once its `locals` block is gone, so a `locals` block that
    exists must be the caller's and name a directory inside the run's directory."""
    path = os.path.join(SHM_DIR, f"{prefix:06}_{LOCALS}")
    try:
        fd = os.open(path, MARKER_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot tell whose prefix {prefix:06} is now ({path}: {e.strerror})"
    try:
        st = os.fstat(fd)
        data = os.read(fd, 1 << 20) if stat.S_ISREG(st.st_mode) else b""
    except OSError as e:
        return f"cannot tell whose prefix {prefix:06} is now ({path}: {e.strerror})"
    finally:
        os.close(fd)
    dirs = locals_dirs(data) if st.st_uid == os.geteuid() else None
    if dirs is None:
        return f"prefix {prefix:06} is held by another dataset now ({path} is not the run's)"
    inside = scratch.rstrip("/") + "/"
    if any(d == scratch or d.startswith(inside) for d in map(os.path.normpath, dirs)):
        return None
    shown = dirs[0] if dirs else "nothing"
    return f"prefix {prefix:06} is held by another dataset now (its locals name {shown})"
