"""How long `pad` takes to lay out 1,000,000 lengths under every strategy: all of
them together should finish in under 5 s (README, "Performance").

    python benchmarks/pad_strategies.py [--samples 1000000] [--repeat 3]

Two sets of lengths, context 4,096, batch 32:
  alpaca   the embedded Alpaca-like distribution (13-307 tokens): few long rows,
           ~43 samples a row when packed;
  uniform  uniform over 1..4,096 tokens: the hard case for bin packing (4,096
           distinct lengths, ~500,000 open rows).
For each, every strategy once per repeat (layout and figures, as `pad` computes
them), after one unmeasured warm-up; prints each strategy's median time and the
median total. Then the whole command end to end on the alpaca lengths (reading
--lengths, every strategy over its shuffles, report written). Exit status 1 when a
median total is over the bar.
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

import numpy as np

from starvecheck.core.strategies import STRATEGIES
from starvecheck.inputs import embedded
from starvecheck.stages.pad import packing

BAR_S = 5.0
CONTEXT = 4096
BATCH = 32


def once(lengths: np.ndarray) -> dict[str, float]:
    times = {}
    for name in STRATEGIES:
        start = time.perf_counter()
        packing.figures(packing.layout(name, lengths, CONTEXT, BATCH, 0), lengths)
        times[name] = time.perf_counter() - start
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    opts = ap.parse_args()
    sets = {
        "alpaca": embedded.alpaca_like(opts.samples),
        "uniform": np.random.RandomState(0).randint(1, CONTEXT + 1, opts.samples),
    }
    failed = False
    for label, lengths in sets.items():
        once(lengths[: min(lengths.size, 10_000)])  # warm-up: imports, allocator
        runs = [once(lengths) for _ in range(opts.repeat)]
        totals = [sum(r.values()) for r in runs]
        print(f"{label}: {opts.samples:,} lengths, mean {lengths.mean():,.0f} tokens")
        for name in STRATEGIES:
            print(f"  {name:<16} {statistics.median(r[name] for r in runs):7.3f} s")
        total = statistics.median(totals)
        print(
            f"  {'all':<16} {total:7.3f} s (min {min(totals):.3f}, max {max(totals):.3f}, "
            f"n={len(totals)}; bar {BAR_S:g} s)"
        )
        failed |= total > BAR_S

    with tempfile.TemporaryDirectory() as out:
        path = os.path.join(out, "lengths.txt")
        np.savetxt(path, sets["alpaca"], fmt="%d")
        cmd = [sys.executable, "-m", "starvecheck", "pad", "--lengths", path, "--json",
               os.path.join(out, "pad.json")]  # fmt: skip
        walls = []
        for _ in range(opts.repeat):
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - start)
        with open(os.path.join(out, "pad.json"), encoding="utf-8") as f:
            params = json.load(f)["stages"][0]["parameters"]
        print(
            f"starvecheck pad --lengths ({opts.samples:,} alpaca lengths, every strategy, "
            f"{params['shuffles']} shuffle(s) where shuffled): median "
            f"{statistics.median(walls):.2f} s wall (min {min(walls):.2f}, max {max(walls):.2f})"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
