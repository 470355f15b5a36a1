"""How long `starvecheck doctor --quick` takes end to end: under 60 s on a 2-core
machine without a GPU (README, "Performance"; it is what `make run` and CI smoke
runs use).

    python benchmarks/doctor_quick.py [--dir DIR] [--repeat 3] [-- extra doctor options]

Runs the installed CLI as a fresh process each time (start-up, every stage's
--quick plan, scratch data written and removed under DIR, the JSON report) and
prints each repeat's wall time with the time each stage reports, then the median.
Exit status 1 when the median is over the bar.
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

BAR_S = 60.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=".", help="directory where io and loader write their data")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="more `starvecheck doctor` options")
    opts = ap.parse_args()
    walls = []
    with tempfile.TemporaryDirectory() as out:
        report = os.path.join(out, "doctor.json")
        cmd = [sys.executable, "-m", "starvecheck", "doctor", "--quick", "--json", report]
        cmd += [*opts.extra, opts.dir]
        for i in range(opts.repeat):
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - start)
            with open(report, encoding="utf-8") as f:
                data = json.load(f)
            # doctor's own duration spans the stages it ran; list theirs.
            stages = ", ".join(
                f"{s['stage']} {s['duration_s']:.1f} s"
                for s in data["stages"]
                if s.get("duration_s") is not None and s["stage"] != "doctor"
            )
            print(
                f"repeat {i + 1}: {walls[-1]:.2f} s wall ({stages}); weakest link "
                f"{data['weakest_link']}",
                flush=True,
            )
    median = statistics.median(walls)
    print(
        f"starvecheck doctor --quick: median {median:.2f} s wall (min {min(walls):.2f}, "
        f"max {max(walls):.2f}, n={len(walls)}); bar {BAR_S:.0f} s: "
        f"{'inside' if median < BAR_S else 'OVER'}"
    )
    return 0 if median < BAR_S else 1


if __name__ == "__main__":
    sys.exit(main())
