"""Command-line values, parsed and checked before anything runs: each bad one is a
`UsageError`, one line and exit 2 (pure functions of their text, so tests feed them
text)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from starvecheck.core import outputs, surroundings
from starvecheck.core import stages as stages_table
from starvecheck.core.status import UsageError
from starvecheck.core.units import parse_size, parse_uint
from starvecheck.inputs.factory import FactorySpec, parse_spec
from starvecheck.inputs.files import PSEUDO_FS, fstype
from starvecheck.stages.options import default_threads

MAX_SAMPLE_SIZE = 1 << 30


def sample_size(text: str) -> int:
    size = parse_size(text)
    if size is None or size < 1:
        raise UsageError(f"--sample-size {text!r}: expected a size such as 16K or 4MiB")
    if size > MAX_SAMPLE_SIZE:
        raise UsageError(f"--sample-size {text}: at most 1GiB")
    return size


def data_path(path: str | None, existing: bool, command: str = "io") -> str:
    """PATH as an absolute, checked directory (or file, with --existing)."""
    shown = path if path is not None else "."
    if path is None:
        if surroundings.cwd_removed():
            raise UsageError(f"{surroundings.REMOVED}: give {command} a PATH")
        path = os.getcwd()
    surroundings.check_relative(path, path)
    try:
        os.stat(path)  # what os.path.exists hides: a link loop, a name too long, no access
    except OSError as e:
        raise UsageError(f"{shown}: {_reason(e)}") from None
    target = os.path.realpath(path)
    kind = fstype(target)
    if kind in PSEUDO_FS:
        raise UsageError(
            f"{shown}: on {kind}, a kernel interface, not storage: give a directory on the "
            "filesystem that holds your training data"
        )
    if existing:
        if not (os.path.isdir(target) or os.path.isfile(target)):
            raise UsageError(f"{shown}: not a directory or regular file")
        if not os.access(target, os.R_OK | (os.X_OK if os.path.isdir(target) else 0)):
            raise UsageError(f"{shown}: not readable")
        return target
    if not os.path.isdir(target):
        raise UsageError(
            f"{shown}: not a directory ({command} writes its test data in a new "
            f"directory there{stages_table.entry(command).without_writing})"
        )
    if not os.access(target, os.W_OK | os.X_OK):
        raise UsageError(
            f"{shown}: not writable ({command} writes its test data in a new directory "
            f"there{stages_table.entry(command).without_writing})"
        )
    if not os.access(target, os.R_OK):
        raise UsageError(
            f"{shown}: writable but not readable (mode {os.stat(target).st_mode & 0o777:o}): "
            f"{command} lists the directory to find its own data and what killed runs left; "
            f"give it read permission (chmod u+r {shown})"
        )
    return target


def _reason(e: OSError) -> str:
    """An OSError's reason in lower case, as ls says it ("no such file or directory")."""
    text = e.strerror or type(e).__name__
    return text[0].lower() + text[1:]


def thread_counts(text: str | None, effective: int | None) -> tuple[int, ...]:
    if text is None:
        return default_threads(effective)
    return counts("--threads", text, 1, 1024)


def worker_counts(text: str | None, high: int = 1024) -> tuple[int, ...] | None:
    """--workers '0,2,4' -> (0, 2, 4); not given (or empty): None, the stage's default."""
    return counts("--workers", text, 0, high) if text else None


def counts(option: str, text: str, low: int, high: int) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16), sorted and unique; anything else is one usage error."""
    # ASCII digits only (not "٢", "+1", "1_0"); "1,,4": an empty item is a typo
    read = [parse_uint(v.strip(" \t")) for v in text.split(",")]
    values = [v for v in read if v is not None]
    if not read or None in read or any(v < low or v > high for v in values):
        raise UsageError(
            f"{option} {text!r}: expected counts from {low} to {high}, e.g. {low},4,16"
        )
    return tuple(sorted(set(values)))


def fields(given: list[str] | None) -> tuple[str, ...]:
    """pad's --field, repeated or comma-separated: 'a,b' 'c' -> ('a', 'b', 'c')."""
    names = tuple(n.strip() for f in given or () for n in f.split(","))
    if any(not n for n in names):
        raise UsageError("--field: empty field name")
    return names


def byte_limit(option: str, text: str) -> int | None:
    """A limit on bytes read: a size such as 4GiB or 512M; 0 for none (None)."""
    size = parse_size(text)
    if size is None:
        raise UsageError(f"{option} {text!r}: expected a size such as 4GiB or 512M (0: no limit)")
    return size or None


def plot_path(value: str | None) -> str | None:
    """Check --plot before anything runs: the file (as output_file), and that
    matplotlib is there. '-' is no file: a PNG is not written to stdout."""
    if value is None:
        return None
    if value in ("", "-") or os.path.isdir(value):
        raise UsageError(f"--plot {value!r}: needs a file path, such as idle.png")
    output_file("--plot", value)
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'starvecheck[plot]'")
    return os.path.abspath(value)  # where it is written, whatever the user's code does


def output_file(option: str, value: str) -> None:
    """Refuse, before anything is measured, a path that cannot take a report: the
    writer's own checks, without writing (core/outputs.py, `refusal`: a link of another
    user, another user's file in a sticky directory, a directory, a missing or closed
    directory, no permission, a name too long), and a file of a kernel interface
    (/proc/version: the write would fail, after the run). A file that exists is written
    in place (/dev/null, a CI step summary, a pipe): its own permission decides; a new
    one needs a directory that takes it. What only the write can tell (a full disk,
    /dev/full) is one line then."""
    if value == "":
        raise UsageError(f"{option} needs a path, or '-' for stdout")
    surroundings.check_relative(f"{option} {value}", value)
    why = outputs.refusal(value)
    if why in (None, outputs.NOT_WRITABLE):  # a link or an owner refused comes first
        with contextlib.suppress(OSError):  # what cannot be looked at, refusal words
            if stat.S_ISREG(os.stat(value).st_mode):
                kind = fstype(os.path.realpath(value))
                if kind in PSEUDO_FS:
                    raise UsageError(
                        f"{option} {value}: a file of a kernel interface ({kind}), not one to write"
                    )
    if why is not None:
        raise UsageError(f"{option} {value}: {why}")


def _same_file(a: str, b: str) -> bool:
    """One file under two names: ./F, a symlink (realpath), a hard link (samefile)."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
    except OSError:  # relative, in a working directory removed: refused where it is read
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


def distinct_files(
    outputs: Sequence[tuple[str, str | None]], inputs: Sequence[tuple[str, str | None]] = ()
) -> None:
    """Refuse, before anything is measured, two outputs that name one file (one would
    overwrite the other: --plot X --json X), and an output that names an input (the
    report would overwrite the trace or dataset it was made from). `-` is stdout, not
    a file: where it may appear twice is the caller's to say."""
    files = [(o, p) for o, p in outputs if p not in (None, "", "-")]
    sources = [(o, p) for o, p in inputs if p not in (None, "", "-")]
    for i, (option, path) in enumerate(files):
        for other, other_path in files[i + 1 :]:
            if _same_file(path, other_path):
                raise UsageError(
                    f"{option} {path} and {other} {other_path} are the same file: give each its own"
                )
        for source, source_path in sources:
            if _same_file(path, source_path):
                raise UsageError(
                    f"{option} {path} is the file {source} {source_path} reads: writing the "
                    "report there would overwrite it; give the report its own file"
                )


def output_dir(option: str, value: str) -> str:
    """A directory for files the user asked to keep: made if missing (its parent must
    exist), refused if it is a file or not writable."""
    if value == "":
        raise UsageError(f"{option} needs a directory")
    surroundings.check_relative(f"{option} {value}", value)
    target = Path(value)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{option} {value}: not a directory")
    if not target.exists():
        if not target.parent.is_dir():
            raise UsageError(f"{option} {value}: directory {target.parent} does not exist")
        try:
            target.mkdir()
        except OSError as e:
            raise UsageError(f"{option} {value}: cannot create it: {e.strerror}") from e
    if not os.access(target, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {value}: not writable")
    return str(target.resolve())


MIN_COPY_SIZE = 4 << 10
MAX_COPY_SIZE = 16 << 30


def copy_sizes(text: str) -> tuple[int, ...]:
    """--sizes '64K,1M,256MiB' -> bytes, sorted and unique; each 4KiB to 16GiB."""
    sizes = [parse_size(part) for part in text.split(",")]
    if not text.strip() or any(s is None for s in sizes):
        raise UsageError(f"--sizes {text!r}: expected sizes such as 64K,1M,256MiB")
    bad = [s for s in sizes if s is None or not MIN_COPY_SIZE <= s <= MAX_COPY_SIZE]
    if bad:
        raise UsageError(f"--sizes {text!r}: each size must be from 4KiB to 16GiB")
    return tuple(sorted({s for s in sizes if s is not None}))


def factory_spec(text: str | None) -> FactorySpec | None:
    """--factory FILE.py:FUNC or package.module:FUNC, parsed once, here: every later
    step takes the FactorySpec (inputs/factory.py). None where none was given."""
    if text is None:
        return None
    spec = parse_spec(text)
    surroundings.check_relative(f"--factory {text}", spec.path)
    # FILE.py from here, whatever directory the user's code moves to (a later import of
    # it, for an IterableDataset, comes after FUNC ran).
    return replace(spec, path=os.path.abspath(spec.path)) if spec.path else spec
