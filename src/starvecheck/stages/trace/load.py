"""Reading Kineto / Chrome traces: one file, several files, or a directory of them.

A trace of a real job is large (a million events, hundreds of MB of JSON) and the
analysis reads eight fields of each event. So the first try decodes straight into
`Event` structs with msgspec, which skips every other field (kernel args, shapes,
stacks) without building it: about 4x faster than `json.load` at half its memory
(benchmarks/trace_scale.py). A file that does not fit that shape (an event that is
not an object, args that are not one, JSON that needs mending) is read again the
slow way, as plain Python objects, and its events converted; every way a file can
fail to be a trace is one usage line naming it.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from starvecheck.core import clocks, surroundings
from starvecheck.core.status import UsageError
from starvecheck.inputs.files import STDIN, open_input, read_all
from starvecheck.stages.options import TraceOptions

# The most JSON one trace file may hold, unpacked (TraceOptions.max_bytes, where it is
# declared).
MAX_BYTES = TraceOptions.max_bytes
# A JSON escape (kept), or a backslash that starts none (doubled).
_BAD_ESCAPE = re.compile(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})?')
_NUMBER = (int, float)
# What a directory of traces holds: tensorboard_trace_handler writes
# <worker>.<time>.pt.trace.json(.gz), one per rank.
TRACE_SUFFIXES = (".json", ".json.gz")
# The furthest a time may lie from the clock's zero, in microseconds: 2^53 us is 285
# years (Kineto's clock counts from 1970), and the largest span a double holds to the
# microsecond. Past it, times are rounded by milliseconds (near 2^63, by 2 ms), enough
# to turn a step's figures into nonsense, so such a trace is refused, not read.
MAX_TIME_US = float(1 << 53)
# The most ranks a trace's distributedInfo may claim: more than any job has run
# (a claim past it is forged or corrupt, and the ranks it lacks would be listed).
MAX_WORLD_SIZE = 1 << 20
# The most trace files one run reads: a directory as large is not one job's folder
# (each file becomes a rank, and each rank a row).
MAX_FILES = 10_000


class Args(msgspec.Struct, gc=False):
    """The one argument the analysis reads: which host call launched a GPU event."""

    correlation: Any = None


class Event(msgspec.Struct, gc=False):
    """A trace event, the fields the analysis reads. Values are as the file has them
    (any JSON type); `span` says whether the event is a usable complete event."""

    ph: Any = None
    name: Any = None
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: Args | None = None

    @classmethod
    def of(cls, e: Mapping[str, Any]) -> Event:
        """From a plain JSON object (the slow path, and tests)."""
        args = e.get("args")
        corr = args.get("correlation") if isinstance(args, Mapping) else None
        return cls(
            e.get("ph"),
            e.get("name"),
            e.get("cat"),
            e.get("ts"),
            e.get("dur"),
            e.get("pid"),
            e.get("tid"),
            Args(corr) if corr is not None else None,
        )

    @property
    def correlation(self) -> Any:
        return self.args.correlation if self.args is not None else None


class _Typed(msgspec.Struct, gc=False):
    traceEvents: list[Event]
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None


_DECODE_TYPED = msgspec.json.Decoder(_Typed | list[Event])


@dataclass(frozen=True)
class JobId:
    """Which job a file says it belongs to (its `distributedInfo`): the world size and
    the process groups (backend, names, sizes, ranks), alike on every rank of one job."""

    world_size: int | None = None
    groups: str = ""  # the process groups' configuration, as canonical JSON


@dataclass(frozen=True)
class TraceFile:
    """One file's events, the rank it says it is (distributedInfo.rank), the job it says
    it belongs to, and the clock its timestamps count from (baseTimeNanoseconds, in
    µs: Kineto writes times relative to it)."""

    path: str
    events: list[Event]
    rank: int | None = None
    job: JobId = JobId()
    base_us: float = 0.0


def span(e: Event) -> tuple[float, float] | None:
    """(start, end) in microseconds of a complete event; None for anything else
    (instants, metadata, counters, and events whose times are missing or absurd)."""
    if e.ph != "X":
        return None
    ts, dur = e.ts, e.dur
    # type(), not isinstance(): JSON true is no timestamp.
    if type(ts) not in _NUMBER or type(dur) not in _NUMBER:
        return None
    try:
        start, length = float(ts), float(dur)
    except OverflowError:  # an integer past any float
        return None
    end = start + length
    # Inside the clock's range, which also leaves out NaN and infinities.
    return (start, end) if length >= 0 and start > -MAX_TIME_US and end < MAX_TIME_US else None


def _out_of_range(e: Event) -> bool:
    """A complete event whose times are numbers past what a trace's clock can hold
    exactly (see MAX_TIME_US): a forged or corrupt trace, not one to round."""
    if e.ph != "X" or type(e.ts) not in _NUMBER or type(e.dur) not in _NUMBER:
        return False
    try:
        start, end = float(e.ts), float(e.ts) + float(e.dur)
    except OverflowError:  # an integer past any float
        return True
    return not (-MAX_TIME_US < start < MAX_TIME_US and -MAX_TIME_US < end < MAX_TIME_US)


class TooSlow(UsageError):
    """Reading and analysing the traces ran past their time limit."""


class Deadline:
    """The time reading and analysing one set of traces may take (None: no limit):
    the work is linear in events, so it is checked between files, ranks and blocks
    of steps, and a trace that takes longer ends the run in one line."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = seconds
        self.at = clocks.monotonic() + seconds if seconds else math.inf

    def check(self, doing: str) -> None:
        if clocks.monotonic() > self.at:
            raise TooSlow(
                f"--trace: {doing} ran past the time limit of {self.seconds:g} s; raise it "
                "with --max-trace-seconds, 0 for none"
            )


def trace_files(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The files to read: each path a file, or a directory whose trace files
    (`*.json`, `*.json.gz`, not recursive) are read, in name order."""
    return [path for path, _ in expand(paths)]


def expand(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[str, bool]]:
    """(file, whether it was found in a directory rather than named) for each file to
    read, each once: a file found in a directory that is not a trace is skipped with a
    note (a `metrics.json` beside the traces); one named is an error."""
    out: list[tuple[str, bool]] = []
    for p in paths:
        name = os.fspath(p)
        surroundings.check_relative(f"--trace {name}", name)
        if name == STDIN:
            out.append((name, False))
        elif os.path.isdir(name):
            found = []
            for f in Path(name).iterdir():
                if f.name.endswith(TRACE_SUFFIXES) and f.is_file():
                    found.append(str(f))
                    _count(len(out) + len(found))  # before listing a million
            if not found:
                raise UsageError(
                    f"--trace {name}: a directory with no trace files (*.json, *.json.gz)"
                )
            out += [(f, True) for f in sorted(found)]
        else:
            out.append((name, False))
        _count(len(out))
    seen: set[str] = set()
    unique = []
    for f, listed in out:
        key = f if f == STDIN else os.path.realpath(f)
        if key not in seen:
            seen.add(key)
            unique.append((f, listed))
    return unique


def _count(files: int) -> None:
    if files > MAX_FILES:
        raise UsageError(
            f"--trace: more than {MAX_FILES:,} trace files, the most one run reads (each "
            "file is a rank): pass one run's own files, a folder per run"
        )


def load(path: str | os.PathLike[str], max_bytes: int | None = MAX_BYTES) -> TraceFile:
    """One trace file, read as fast as its shape allows; more than `max_bytes` of JSON
    (unpacked; None: no limit) is refused in one line."""
    name = os.fspath(path)

    def fail(why: str) -> UsageError:
        return UsageError(f"--trace {name}: {why}")

    try:
        data = _read(name, max_bytes)
    except FileNotFoundError:
        raise fail("no such file") from None
    except IsADirectoryError:
        raise fail("is a directory, not a trace file") from None
    except PermissionError:
        raise fail("permission denied") from None
    except (gzip.BadGzipFile, EOFError, zlib.error):
        raise fail("not a readable gzip file (truncated or corrupt)") from None
    except MemoryError:
        raise fail("too large to read into memory") from None
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    try:
        typed = _DECODE_TYPED.decode(data)
    except MemoryError:
        raise fail("too large to read into memory") from None
    except (msgspec.DecodeError, RecursionError):
        typed = None
    base: Any = None
    if typed is not None:
        del data
        if isinstance(typed, list):
            events, info = typed, None
        else:
            events, info = typed.traceEvents, typed.distributedInfo
            base = typed.baseTimeNanoseconds
    else:
        events, info, base = _slow(data, fail)
        del data
    _check_times(events, fail)
    base_us = _base_us(base)
    if base_us is None:
        raise fail(f"baseTimeNanoseconds {base!r:.24} is past {_CLOCK}")
    return TraceFile(name, events, _rank(info, fail), _job(info, fail), base_us)


_CLOCK = "2^53 us (285 years) from the clock's zero: not a trace's clock"


def _base_us(base: Any) -> float | None:
    """The clock the file's times count from, in us (0 where it names none); None
    where it is past the clock's range."""
    if type(base) not in _NUMBER:
        return 0.0
    try:
        us = float(base) / 1e3
    except OverflowError:  # an integer past any float
        return None
    return us if -MAX_TIME_US < us < MAX_TIME_US else None


def _check_times(events: Sequence[Event], fail: Any) -> None:
    """Refuse a trace with no timed event, or with an event whose times no clock
    holds exactly (the first such named)."""
    timed = False
    for e in events:
        if span(e) is not None:
            timed = True
        elif _out_of_range(e):
            raise fail(f"an event at ts {e.ts!r:.24} (dur {e.dur!r:.24}) is past {_CLOCK}")
    if not timed:
        raise fail("no timed events (complete events with ts and dur) in the trace")


def _read(name: str, max_bytes: int | None) -> bytearray:
    """The trace's bytes, gunzipped, read a chunk at a time and counted as they come:
    past `max_bytes` (unpacked) the read stops in one line, so a gzip bomb costs
    `max_bytes` of memory, not its unpacked size. `-` is standard input; a pipe
    (/dev/stdin, a process substitution) is read as it comes, with the idle time limit
    of starvecheck.inputs.files; a FIFO, a device or a socket is refused before it is opened."""
    lift = "; raise it with --max-trace-bytes, 0 for none"
    with open_input(name, f"--trace {name}", max_bytes, lift) as f:
        return read_all(f)


def _slow(data: bytes, fail: Any) -> tuple[list[Event], Any, Any]:
    """Plain JSON objects, as json reads them (mending what Kineto gets wrong), then
    the events among them."""
    try:
        doc = _parse(data)
    except json.JSONDecodeError as e:
        raise fail(f"not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError:
        raise fail("not JSON (not UTF-8 text)") from None
    except RecursionError:
        raise fail("not a Chrome trace (JSON nested too deeply to read)") from None
    except MemoryError:
        raise fail("too large to read into memory") from None
    except ValueError as e:  # what else json rejects, such as lone surrogates
        raise fail(f"not JSON ({' '.join(str(e).split())})") from None
    info = base = None
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise fail("not a Chrome trace (no traceEvents)")
        info, base = doc.get("distributedInfo"), doc.get("baseTimeNanoseconds")
        doc = doc["traceEvents"]
        if not isinstance(doc, list):
            raise fail("not a Chrome trace (traceEvents is not a list)")
    elif not isinstance(doc, list):
        raise fail(f"not a Chrome trace (a JSON {type(doc).__name__}, not an object)")
    return [Event.of(e) for e in doc if isinstance(e, dict)], info, base


def _parse(data: bytes) -> Any:
    """JSON, or the JSON that Kineto meant. Some traces are not quite JSON: Windows
    paths with unescaped backslashes in with_stack frames (pytorch/pytorch#98432),
    control characters and bytes that are not UTF-8 in names (pytorch/kineto#80, #336).
    Those only spoil names, never times, so a second try mends them as the TensorBoard
    plugin does; when that fails too, the first error is the one reported."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as first:
        text = data.decode("utf-8", errors="replace")
        try:
            return json.loads(_BAD_ESCAPE.sub(_mend_escape, text), strict=False)
        except ValueError:
            raise first from None


def _mend_escape(match: re.Match[str]) -> str:
    return match.group(0) if match.group(1) else "\\\\"


def _rank(info: Any, fail: Any) -> int | None:
    rank = info.get("rank") if isinstance(info, dict) else None
    if type(rank) is not int or rank < 0:
        return None
    if rank >= MAX_WORLD_SIZE:
        raise fail(
            f"distributedInfo.rank {_short(rank)} is past {MAX_WORLD_SIZE:,} ranks: {_FORGED}"
        )
    return rank


def _short(n: int) -> str:
    """A claimed number, its first digits where it has many."""
    text = str(n)
    return text if len(text) <= 16 else f"{text[:12]}... ({len(text)} digits)"


_FORGED = "more than any job has run (a forged or corrupt distributedInfo)"


def _job(info: Any, fail: Any) -> JobId:
    """The job a file's distributedInfo names; JobId() where it names none."""
    if not isinstance(info, dict):
        return JobId()
    size = info.get("world_size")
    if type(size) is int and size > MAX_WORLD_SIZE:
        raise fail(
            f"distributedInfo.world_size {_short(size)} is past {MAX_WORLD_SIZE:,} ranks: {_FORGED}"
        )
    groups = {k: info.get(k) for k in ("backend", "pg_count", "pg_config")}
    try:
        text = json.dumps(groups, sort_keys=True, default=str)[:4096]
    except (TypeError, ValueError):  # circular or odd values: not an identity
        text = ""
    return JobId(size if type(size) is int and size > 0 else None, text)


def as_events(events: Iterable[Event | Mapping[str, Any]]) -> list[Event]:
    """Events, whether decoded here or handed over as JSON objects (tests, callers)."""
    return [
        e if isinstance(e, Event) else Event.of(e) for e in events if isinstance(e, Event | Mapping)
    ]
