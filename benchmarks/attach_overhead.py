"""What `starvecheck attach` costs the job it reads. A loop with a 10 ms step and two
DataLoader workers (tests/loops/attach_loop.py, mode `steady`) runs throughout; in
rounds, its steps a second are read over a window without attach and over a window
with `attach --duration`, in turn (each round in the other order), and compared round
by round; the median and the rounds' range are printed, at the default rate and at the
ceiling. And after attach ends: the loop's rate again, against the first windows.

    python benchmarks/attach_overhead.py [--rounds 5] [--seconds 8]

Target (docs/performance.md; exit 1 when missed): under 1% at the default rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "tests" / "loops" / "attach_loop.py"
sys.path.insert(0, str(LOOP.parent))
from loopstate import read_state, stop_tree  # noqa: E402

TARGET = 0.01


def _rate(path: Path, seconds: float, during: list[str] | None) -> float:
    """The loop's steps a second over `seconds` (with `during` running beside it)."""
    p = (
        subprocess.Popen(during, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if during
        else None
    )
    if p is not None:
        time.sleep(2.0)  # attach's start-up (imports, py-spy attaching) is not its steady cost
    a = read_state(path)
    time.sleep(seconds)
    b = read_state(path)
    if p is not None:
        p.wait(timeout=120)
    return (b["steps"] - a["steps"]) / (b["total"] - a["total"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "steady.json"
        loop = subprocess.Popen(
            [sys.executable, str(LOOP), "steady", str(path)], start_new_session=True
        )
        while not path.exists():
            time.sleep(0.1)
        time.sleep(3.0)
        results = {}
        try:
            first = _rate(path, a.seconds, None)
            for rate in (50, 200):
                attach = [sys.executable, "-m", "starvecheck", "attach", str(loop.pid),
                          "--rate", str(rate), "--duration", f"{a.seconds + 3:g}",
                          "--json", str(Path(tmp) / f"attach-{rate}.json")]  # fmt: skip
                ratios = []
                for r in range(a.rounds):
                    order = (None, attach) if r % 2 == 0 else (attach, None)
                    got = [_rate(path, a.seconds, x) for x in order]
                    bare, watched = (got[0], got[1]) if r % 2 == 0 else (got[1], got[0])
                    ratios.append(watched / bare)
                results[rate] = ratios
            after = _rate(path, a.seconds, None)
        finally:
            stop_tree(loop)
    ok = True
    for rate, ratios in results.items():
        cost = 1 - statistics.median(ratios)
        print(f"attach --rate {rate}: the loop's steps/s with attach over without, median "
              f"{statistics.median(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f}, "
              f"n={len(ratios)}): {cost:+.2%} slower")  # fmt: skip
        if rate == 50 and cost > TARGET:
            ok = False
    print(
        f"after attach ended: {after:.1f} steps/s against {first:.1f} before ({after / first:.4f})"
    )
    verdict = "met" if ok else "MISSED"
    print(f"{os.cpu_count()} CPUs; target under {TARGET:.0%} at the default rate: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
