"""starvecheck io against fio on the same files, in one run.

Writes the samples once (as `starvecheck io` does: one file per sample and one
shard), then alternates, round after round:
  - starvecheck `shard.sequential.cold` (1 reader)
      vs fio --rw=read --bs=<sample size> --invalidate=1 --ioengine=psync on the shard;
  - starvecheck `small_files.random.cold` (1 reader)
      vs fio reading the same small files one open file at a time
      (--opendir, --openfiles=1, --file_service_type=sequential).
Both sides start cold: the files are evicted and mincore-checked before every
measurement (fio's --invalidate=1 evicts too). Prints the medians, the ratios
starvecheck/fio, and whether each is inside its bar (10% shard, 15% small files).

    python benchmarks/io_vs_fio.py [--dir DIR] [--samples 10000] [--sample-size 16K]
                                   [--rounds 5]

Needs fio (Debian: apt-get install fio). Exit status 0 when both ratios are inside
their bars, 1 when not, 2 when fio is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from starvecheck.core.signals import signals_raise
from starvecheck.core.units import parse_size
from starvecheck.scratch.directory import Scratch
from starvecheck.stages.io import MB, Layout, Plan, generate
from starvecheck.stages.samples import cache
from starvecheck.stages.samples.reads import timed_run

BARS = {"shard.sequential.cold": 0.10, "small_files.random.cold": 0.15}


def evicted(layout: Layout) -> float | None:
    cache.evict(layout.paths, dir_fd=layout.dir_fd, sync=False)
    return layout.residency().fraction


def starvecheck_mbps(layout: Layout, pattern: str) -> float:
    r = timed_run(
        layout.ops[pattern],
        threads=1,
        buffer_size=layout.buffer_size,
        contiguous=pattern == "sequential",
    )
    return r.bytes / r.seconds / MB


def fio_mbps(args: list[str]) -> float:
    proc = subprocess.run(
        ["fio", "--output-format=json", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    text = proc.stdout
    report = json.loads(text[text.index("{") :])  # --opendir prints a line before the JSON
    job = report["jobs"][0]
    if job["error"]:
        raise RuntimeError(f"fio failed: error {job['error']}")
    return job["read"]["bw_bytes"] / MB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=".", help="directory on the storage to test")
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--sample-size", default="16K")
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    if shutil.which("fio") is None:
        print("fio not found: apt-get install fio", file=sys.stderr)
        return 2
    size = parse_size(opts.sample_size)
    if not size:
        print(f"bad --sample-size {opts.sample_size!r}", file=sys.stderr)
        return 2
    plan = Plan(samples=opts.samples, sample_size=size, runs=1, threads=(1,))
    ours: dict[str, list[float]] = {k: [] for k in BARS}
    theirs: dict[str, list[float]] = {k: [] for k in BARS}
    resident: list[float] = []
    with signals_raise(), Scratch(os.path.abspath(opts.dir), prefix="starvecheck-bench-") as s:
        small, shard = generate(s, plan)
        shard_path = os.path.join(s.path, "shard.bin")
        samples_dir = os.path.join(s.path, "samples")
        fio_common = ["--rw=read", f"--bs={size}", "--invalidate=1", "--ioengine=psync"]
        for i in range(opts.rounds):
            resident.append(evicted(shard) or 0.0)
            ours["shard.sequential.cold"].append(starvecheck_mbps(shard, "sequential"))
            resident.append(evicted(shard) or 0.0)
            theirs["shard.sequential.cold"].append(
                fio_mbps(["--name=shard", f"--filename={shard_path}", *fio_common])
            )
            resident.append(evicted(small) or 0.0)
            ours["small_files.random.cold"].append(starvecheck_mbps(small, "random"))
            resident.append(evicted(small) or 0.0)
            theirs["small_files.random.cold"].append(
                fio_mbps(
                    [
                        "--name=small",
                        f"--opendir={samples_dir}",
                        "--openfiles=1",
                        "--file_service_type=sequential",
                        *fio_common,
                    ]
                )
            )
            print(
                f"round {i + 1}/{opts.rounds}: "
                + ", ".join(
                    f"{k} starvecheck {ours[k][-1]:,.0f} fio {theirs[k][-1]:,.0f} MB/s"
                    for k in BARS
                ),
                flush=True,
            )
    print(
        f"\n{opts.samples:,} samples x {size:,} B in {opts.dir}; {opts.rounds} rounds; "
        f"largest resident fraction before a cold read: {max(resident):.3f}"
    )
    ok = True
    for name, bar in BARS.items():
        a, b = statistics.median(ours[name]), statistics.median(theirs[name])
        ratio = a / b
        inside = abs(ratio - 1) <= bar
        ok &= inside
        print(
            f"{name:<24} starvecheck {a:8,.0f} MB/s (min {min(ours[name]):,.0f}, max "
            f"{max(ours[name]):,.0f})  fio {b:8,.0f} MB/s (min {min(theirs[name]):,.0f}, max "
            f"{max(theirs[name]):,.0f})  ratio {ratio:.3f}  bar ±{bar:.0%}  "
            f"{'inside' if inside else 'OUTSIDE'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
