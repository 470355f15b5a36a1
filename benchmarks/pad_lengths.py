"""How long `pad --lengths` takes to read 1,000,000 lengths: the reader from before
the hardening of issue 18, the per-line reader it left (a line cut while read, a
context manager per line), and the block reader that replaced both, side by side;
then the whole command on the same file, with where its time goes.

    python benchmarks/pad_lengths.py [--samples 1000000] [--repeat 7] [--runs 5]

The file is the embedded Alpaca-like lengths, one per line, as `pad_strategies.py`
writes them. The three readers run in turns (the order rotated each round) after one
unmeasured round, so that a busy machine slows them alike; each round checks that
they all read the same array. The report gives median, min … max and stdev for each
and the ratios of medians measured in this one run. Then `starvecheck pad --lengths
FILE` end to end (no --quick: it would stop at 20,000 lengths), after one warm-up,
and the same `pad.run` in this process, to split the command's time into reading,
laying out every strategy, and the rest (start-up, imports, machine facts, report).

Target (issue 26): the block reader in at most half the time of the reader before
the hardening. Exit status 1 when it misses.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import numpy as np

from starvecheck.core.status import UsageError
from starvecheck.inputs import embedded, lengths
from starvecheck.stages.pad import stage as pad

TARGET_RATIO = 0.5


# --- the reader before the hardening -------------------------------------------------
# Copied from src/starvecheck/stages/textdata.py at eea5d0b, the last commit before
# issue 18's hardening (3818cc4, 3ee2aa8): the file iterated line by line, no cut.

_COUNT = re.compile(r"[0-9]+")
MAX_LENGTH = 1 << 40


def _parse_lengths(lines: Iterable[str], name: str, limit: int | None = None) -> np.ndarray:
    """One token count per line; blank lines and lines starting with # are skipped."""
    out: list[int] = []
    for lineno, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        if not _COUNT.fullmatch(text):
            shown = text if len(text) <= 20 else text[:20] + "..."
            raise UsageError(
                f"--lengths {name}: line {lineno}: {shown!r} is not a token count "
                "(one whole number per line)"
            )
        value = int(text)
        if value > MAX_LENGTH:
            raise UsageError(f"--lengths {name}: line {lineno}: {text[:20]} tokens is too many")
        out.append(value)
        if limit is not None and len(out) >= limit:
            break
    return np.array(out, dtype=np.int64)


def _open_raw(path: str, option: str) -> IO[Any]:
    # _open_text's opening, the same at both commits.
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a directory (name a file)")
    try:
        return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")
    except FileNotFoundError:
        raise UsageError(f"{option} {path}: no such file") from None
    except OSError as e:
        raise UsageError(f"{option} {path}: {e.strerror or e}") from None


class _CheckedBefore(io.TextIOWrapper):
    """UTF-8 text whose decoding and gzip errors become one usage line."""

    def __init__(self, raw: IO[bytes], where: str) -> None:
        super().__init__(raw, encoding="utf-8", newline="")  # type: ignore[arg-type]
        self._where = where

    def __next__(self) -> str:
        try:
            return super().__next__()
        except UnicodeDecodeError as e:
            raise UsageError(f"{self._where}: not UTF-8 text ({e.reason})") from None
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise UsageError(f"{self._where}: cannot read: {e}") from None


def read_before_hardening(path: str, limit: int | None = None) -> np.ndarray:
    with _CheckedBefore(_open_raw(path, "--lengths"), f"--lengths {path}") as f:
        return _parse_lengths(f, path, limit)


# --- the per-line reader the hardening left --------------------------------------------
# Copied from src/starvecheck/stages/textdata.py at cb5a92a (HEAD before the block
# reader): each line read with readline(4096) (cut while read, 3ee2aa8) through a
# context manager (f7d2e41), then the same parse_lengths.


class _CheckedHead(io.TextIOWrapper):
    """UTF-8 text whose decoding and gzip errors become one usage line."""

    def __init__(self, raw: IO[bytes], where: str) -> None:
        # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first field.
        super().__init__(raw, encoding="utf-8-sig", newline="")  # type: ignore[arg-type]
        self._where = where

    def __next__(self) -> str:
        with self._checked():
            return super().__next__()

    def readline(self, size: int | None = -1) -> str:
        with self._checked():
            return super().readline(size)

    @contextmanager
    def _checked(self) -> Iterator[None]:
        try:
            yield
        except UnicodeDecodeError as e:
            raise UsageError(f"{self._where}: not UTF-8 text ({e.reason})") from None
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise UsageError(f"{self._where}: cannot read: {e}") from None


def _lines(f: IO[str], cap: int) -> Iterator[tuple[int, str, bool]]:
    # (its refusal of an over-long record left out: --lengths never asks for it)
    lineno = 0
    while True:
        line = f.readline(cap)
        if not line:
            return
        lineno += 1
        if len(line) < cap or line.endswith("\n"):
            yield lineno, line, False
            continue
        rest = line
        while len(rest) == cap and not rest.endswith("\n"):
            rest = f.readline(cap)
        yield lineno, line, True


def read_per_line(path: str, limit: int | None = None) -> np.ndarray:
    with _CheckedHead(_open_raw(path, "--lengths"), f"--lengths {path}") as f:
        return _parse_lengths((line for _, line, _ in _lines(f, 4096)), path, limit)


# --- measuring ---------------------------------------------------------------------------

READERS: dict[str, Callable[[str], np.ndarray]] = {
    "before the hardening (eea5d0b)": read_before_hardening,
    "per line, cut while read (cb5a92a)": read_per_line,
    "block reader (lengths.read_lengths)": lengths.read_lengths,
}


def time_readers(path: str, rounds: int) -> dict[str, list[float]]:
    names = list(READERS)
    times: dict[str, list[float]] = {name: [] for name in names}
    want = None
    for r in range(rounds + 1):  # round 0: warm-up (page cache, imports, allocator)
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            got = READERS[name](path)
            took = time.perf_counter() - start
            if want is None:
                want = got
            if not np.array_equal(got, want) or got.dtype != want.dtype:
                raise SystemExit(f"{name} read another array than {names[0]}")
            if r:
                times[name].append(took)
    return times


def time_command(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)  # warm-up
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - start)
    return walls


def time_run(path: str, runs: int) -> list[float]:
    plan = pad.Plan(lengths=path)
    pad.run(plan)  # warm-up
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        pad.run(plan)
        walls.append(time.perf_counter() - start)
    return walls


def line(name: str, values: list[float]) -> str:
    med = statistics.median(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return (
        f"{name:<44} {med * 1000:7.0f} ms  (min {min(values) * 1000:.0f} … max "
        f"{max(values) * 1000:.0f}, σ {sd * 1000:.0f}, n={len(values)})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7, help="rounds of the three readers")
    ap.add_argument("--runs", type=int, default=5, help="runs of the whole command")
    opts = ap.parse_args()

    with tempfile.TemporaryDirectory() as out:
        path = os.path.join(out, "lengths.txt")
        np.savetxt(path, embedded.alpaca_like(opts.samples), fmt="%d")
        size_mib = os.path.getsize(path) / (1 << 20)
        print(f"{opts.samples:,} Alpaca-like lengths, {size_mib:.1f} MiB, one per line")
        times = time_readers(path, opts.repeat)
        for name, values in times.items():
            print(line(f"read: {name}", values))
        before, per_line, block = (statistics.median(v) for v in times.values())

        cmd = [sys.executable, "-m", "starvecheck", "pad", "--lengths", path,
               "--json", os.path.join(out, "pad.json")]  # fmt: skip
        command = time_command(cmd, opts.runs)
        in_process = time_run(path, opts.runs)
        print(line("starvecheck pad --lengths FILE (end to end)", command))
        print(line("  pad.run in this process", in_process))
        wall, run = statistics.median(command), statistics.median(in_process)
        print(f"  of the command's {wall:.2f} s (medians):")
        for part, took in (
            ("reading --lengths (block reader)", block),
            ("laying out every strategy, figures", run - block),
            ("start-up, imports, machine facts, report", wall - run),
        ):
            print(f"    {part:<42} {took * 1000:7.0f} ms  {took / wall:4.0%}")

    ratio = block / before
    print(
        f"\nblock reader / before the hardening  {ratio:.3f}  ({before / block:.0f} times faster)"
        f"\nblock reader / per line              {block / per_line:.3f}  "
        f"({per_line / block:.0f} times faster)"
        f"\nper line / before the hardening      {per_line / before:.2f}"
        "\n(ratios of medians, this run)"
    )
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    print(f"block reader {verdict} the target of at most {TARGET_RATIO:g} of the time before.")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
