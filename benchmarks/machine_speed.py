"""Does this machine run the same Python work at one speed? (docs/performance.md, "A
machine at two speeds")

Times one round of benchmarks/pipelines/stages.py's pure-Python work (a word-level
tokenizer, the work the stage benchmarks size their pipelines by) in readings of 400
rounds, on the thread's own CPU clock (time.thread_time: a wait for a CPU is not in it),
with a pause between readings, for --seconds. A reading slower than SLOW times the
fastest tenth's median is a slow reading; consecutive slow readings make an episode.
Nothing else should run: on a machine that keeps one speed every reading is within a
few percent of the fastest, and the slow share is 0.

    python benchmarks/machine_speed.py [--seconds 60] [--pause 0.2]

Prints the readings' quantiles, the slow share, and the episodes' count and lengths.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "pipelines"))

import stages

ROUNDS = 400  # one reading: about 13 ms of work at 32 µs a round
SLOW = 1.3  # a reading this much slower than the fast readings' median is slow


def readings(seconds: float, pause: float) -> list[tuple[float, float]]:
    """(seconds since the start, µs of CPU a round) for each reading."""
    for _ in range(200):  # warm-up: a cold first round runs slower
        stages._tokenize()
    out, began = [], time.perf_counter()
    while time.perf_counter() - began < seconds:
        at, cpu = time.perf_counter() - began, time.thread_time()
        for _ in range(ROUNDS):
            stages._tokenize()
        out.append((at, (time.thread_time() - cpu) / ROUNDS * 1e6))
        time.sleep(pause)
    return out


def episodes(taken: list[tuple[float, float]], slow: float) -> list[float]:
    """The lengths in seconds of the runs of consecutive slow readings (a run of one
    reading counts its own length, 0)."""
    out, start, last = [], None, 0.0
    for at, us in taken:
        if us > slow:
            start = at if start is None else start
            last = at
        elif start is not None:
            out.append(last - start)
            start = None
    if start is not None:
        out.append(last - start)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pause", type=float, default=0.2)
    args = parser.parse_args()
    taken = readings(args.seconds, args.pause)
    us = sorted(u for _, u in taken)
    fast = statistics.median(us[: max(1, len(us) // 10)])
    slow = [u for u in us if u > SLOW * fast]
    runs = episodes(taken, SLOW * fast)
    q = statistics.quantiles(us, n=20)
    print(f"{len(us)} readings of {ROUNDS} rounds over {args.seconds:g} s")
    print(f"µs a round: fastest {us[0]:.1f}, p5 {q[0]:.1f}, median {statistics.median(us):.1f}, "
          f"p95 {q[-1]:.1f}, slowest {us[-1]:.1f}")  # fmt: skip
    if slow:
        mid = statistics.median(slow)
        print(f"slow readings (over {SLOW}x the fast {fast:.1f} µs): {len(slow) / len(us):.0%}, "
              f"median {mid:.1f} µs ({mid / fast:.2f}x)")  # fmt: skip
        longest, typical = max(runs), statistics.median(runs)
        print(f"episodes: {len(runs)}, longest {longest:.1f} s, median {typical:.1f} s")
    else:
        print(f"slow readings (over {SLOW}x the fast {fast:.1f} µs): none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
