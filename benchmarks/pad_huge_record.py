"""`starvecheck pad` on a file whose one record is huge: wall time and peak RSS.

Before 0.2 a 1 GB single-line file grew pad to 23 GB resident and the kernel killed it;
a 100 MB line took 11.3 GB and 88 s. Target: under 2 GB peak for 1 GiB, finishing (a
text line is cut to what the context holds) or refusing in one line (a JSON Lines
record is parsed whole, so one over 64 Mi characters is refused).

    python benchmarks/pad_huge_record.py [--size 1GiB] [--dir /tmp]

Builds the files in a temporary directory (removed afterwards), with a small word-level
tokenizer made here (no download), and runs `starvecheck pad` on each in a child
process; peak RSS is the child's ru_maxrss.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = b"the quick brown fox jumps over the lazy dog "


def write_line(path: Path, size: int, head: bytes = b"", tail: bytes = b"\n") -> None:
    block = WORDS * (1 << 14)
    with open(path, "wb") as f:
        f.write(head)
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
        f.write(tail)


def tokenizer(directory: Path) -> Path:
    import tokenizers
    import transformers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"])
    tok.train_from_iterator([WORDS.decode()] * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]"
    )
    fast.save_pretrained(str(directory))
    return directory


# Runs the command and prints its peak RSS (KiB) last on stderr: RUSAGE_CHILDREN here
# would be the largest of every child so far, not this one's.
_PEAK = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(r.returncode)"
)


def run(argv: list[str]) -> tuple[int, float, float, str]:
    """(exit status, wall seconds, peak RSS in MiB, its last stderr line) of one run."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = r.stderr.strip().splitlines()
    peak_kib = int(lines[-1])
    return r.returncode, wall, peak_kib / 1024, (lines[:-1] or [""])[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB", help="bytes in the one record (1GiB, 100MB, ...)")
    ap.add_argument("--dir", default=None, help="where to build the files (default: $TMPDIR)")
    args = ap.parse_args()
    from starvecheck.core.units import parse_size

    size = parse_size(args.size)
    if size is None:
        sys.exit(f"--size {args.size}: not a size")
    starvecheck = [sys.executable, "-m", "starvecheck", "pad"]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        tok = tokenizer(work / "tok")
        text, jsonl = work / "one-line.txt", work / "one-record.jsonl"
        write_line(text, size)
        write_line(jsonl, size, b'{"text": "', b'"}\n')
        print(f"one record of {size / 2**20:,.0f} MiB, pad --context 4096:")
        for path in (text, jsonl):
            argv = [*starvecheck, "--dataset", str(path), "--tokenizer", str(tok)]
            rc, wall, peak, last = run([*argv, "--json", os.devnull])
            print(f"  {path.name:18s} exit {rc}  {wall:6.1f} s  peak RSS {peak:7,.0f} MiB  {last}")


if __name__ == "__main__":
    main()
