"""How long `starvecheck io` takes end to end: generating and measuring
10,000 x 16 KiB samples with --runs 3 should take under 30 s (README, "Performance").

    python benchmarks/io_overhead.py [--dir DIR] [--repeat 3] [-- extra io options]

Runs the installed CLI as a subprocess (start-up, probes, generation, every
pattern cold and warm with the default reader counts, cleanup, JSON export), and
prints the wall time of each repeat, the median, and the time the stage itself
reports. Exit status 1 when the median is over the bar.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BAR_S = 30.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=".", help="directory on the storage to test")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="more `starvecheck io` options")
    opts = ap.parse_args()
    walls, stages = [], []
    with tempfile.TemporaryDirectory() as out:
        report = os.path.join(out, "io.json")
        cmd = [
            sys.executable,
            "-m",
            "starvecheck",
            "io",
            "--samples",
            "10000",
            "--sample-size",
            "16K",
            "--runs",
            "3",
            "--json",
            report,
            *opts.extra,
            opts.dir,
        ]
        for i in range(opts.repeat):
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - start)
            with open(report, encoding="utf-8") as f:
                stage = json.load(f)["stages"][0]
            stages.append(stage["duration_s"])
            print(
                f"repeat {i + 1}: {walls[-1]:.2f} s wall, stage {stages[-1]:.2f} s, "
                f"threads {stage['parameters']['threads']}",
                flush=True,
            )
    median = statistics.median(walls)
    print(
        f"starvecheck io, 10,000 x 16 KiB, --runs 3: median {median:.2f} s wall "
        f"(min {min(walls):.2f}, max {max(walls):.2f}, n={len(walls)}); "
        f"stage {statistics.median(stages):.2f} s; bar {BAR_S:.0f} s: "
        f"{'inside' if median < BAR_S else 'OVER'}"
    )
    return 0 if median < BAR_S else 1


if __name__ == "__main__":
    sys.exit(main())
