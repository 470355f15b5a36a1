"""Does `loader --factory` measure what more workers truly give, and answer right first
time, fast? A Dataset whose samples each take 100 ms and no CPU (a slow network read:
`time.sleep`): num_workers=k loads exactly k times num_workers=0's samples/s, whatever
else the machine does (sleeping needs no CPU). Issue 46 measured 211-824x for 2 workers
here, counting batches buffered before the window; issue 57 found `--quick` passing it
at batch 16 (every count read at its first batch's pace, 96 s).

    python benchmarks/factory_sleep.py [--quick-only] [--busy]

Two sets, each run with --quick and without, `--json -`:
  batch 4, --workers 0,1,2   each count's measured ratio over num_workers=0
                             (`vs_current`): 1 worker 1x and 2 workers 2x within 20%
  batch 16, the default counts  the count named and its gain (2 workers at least, the
                             gain within 20% of that count's truth, never a pass), and the
                             wall time: --quick 30 s at most, the full run 120 s
The worker count named (or none, with its reason) the same in a set's quick and full
runs (at batch 16 the full run reads counts past the CPUs, the workers waiting; --quick
reads the next one where its first round finds them waiting and still gaining). No
caveat `loader.disturbed`. --busy burns one CPU throughout (the answer must not
move: the workers sleep). Exit status 1 when a target is missed. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

SLEEPY = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Sleepy(Dataset):
        def __len__(self):
            return 4000

        def __getitem__(self, i):
            time.sleep(0.1)
            return torch.zeros(4)


    def make():
        return DataLoader(Sleepy(), batch_size=4)


    def make16():
        return DataLoader(Sleepy(), batch_size=16)
    """
)
WITHIN = 0.20
WALL_S = {True: 30.0, False: 120.0}  # quick, full: batch 16 at the default counts


def run(spec: str, quick: bool, workers: str | None = "0,1,2") -> dict[str, Any]:
    cmd = [sys.executable, "-m", "starvecheck", "loader", "--factory", spec]
    cmd += (["--workers", workers] if workers else []) + ["--json", "-"]
    cmd += ["--quick"] if quick else []
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - started
    if out.returncode not in (0, 1):
        raise SystemExit(f"loader --factory: exit {out.returncode}: {out.stderr[-400:]}")
    stage = json.loads(out.stdout)["stages"][0]
    ratios = {
        m["labels"]["workers"]: m["value"]
        for m in stage["metrics"]
        if m["labels"].get("quantity") == "vs_current" and m["labels"].get("role") == "workers"
    }
    own = next(f for f in stage["findings"] if f["id"] == "loader.own-config")
    return {
        "ratios": ratios,
        "count": (own.get("fix") or {}).get("num_workers"),
        "gain": (own.get("gain") or {}).get("value"),
        "severity": own["severity"],
        "wall": wall,
        "rounds": stage["parameters"].get("rounds"),
        "title": own["title"],
        "disturbed": any("A disturbed measurement" in c for c in stage["caveats"]),
        "reread": stage["parameters"].get("reread") or [],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick-only", action="store_true", help="skip the full runs")
    p.add_argument("--busy", action="store_true", help="burn one CPU throughout")
    args = p.parse_args()
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    modes = (True,) if args.quick_only else (True, False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sleepy.py"
            path.write_text(SLEEPY)
            four = {q: run(f"{path}:make", q) for q in modes}
            sixteen = {q: run(f"{path}:make16", q, None) for q in modes}
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    missed: list[str] = []
    load = " (one CPU burned)" if args.busy else ""
    print(f"sleep-bound Dataset, 100 ms a sample, 4 a batch, --workers 0,1,2{load}")
    print("| run | 1 worker over 0 | 2 workers over 0 | count | re-read | rounds | wall s |")
    print("|---|---|---|---|---|---|---|")
    for quick, r in four.items():
        name = "quick" if quick else "full"
        two, one = r["ratios"].get(2), r["ratios"].get(1)
        print(
            f"| {name} | {one or 'none'} | {two or 'none'} | {r['count']} | "
            f"{len(r['reread'])} | {r['rounds']} | {r['wall']:.0f} |"
        )
        for k, got in ((1, one), (2, two)):
            if got is None or abs(got / k - 1) > WITHIN:
                missed.append(
                    f"batch 4 {name}: {k} workers at {got}x, not {k}x within {WITHIN:.0%}"
                )
        if r["disturbed"]:
            missed.append(f"batch 4 {name}: a disturbed measurement was said")
    if len({r["count"] for r in four.values()}) > 1:
        missed.append("batch 4: quick and full named different counts")
    print(f"\nthe same, 16 a batch, the default counts{load}")
    print("| run | count | gain | severity | rounds | wall s | finding |")
    print("|---|---|---|---|---|---|---|")
    for quick, r in sixteen.items():
        name = "quick" if quick else "full"
        k, gain = r["count"], r["gain"]
        print(
            f"| {name} | {k} | {gain} | {r['severity']} | {r['rounds']} | {r['wall']:.0f} | "
            f"{r['title']} |"
        )
        if r["severity"] == "ok":
            missed.append(f"batch 16 {name}: a pass")
        elif k is None or k < 2 or gain is None or abs(gain / k - 1) > WITHIN:
            missed.append(f"batch 16 {name}: num_workers={k} at {gain}x, not its truth within 20%")
        if r["wall"] > WALL_S[quick]:
            missed.append(f"batch 16 {name}: {r['wall']:.0f} s, over {WALL_S[quick]:.0f} s")
    if len({r["count"] for r in sixteen.values()}) > 1:
        missed.append("batch 16: quick and full named different counts")
    for m in missed:
        print("MISSED:", m, file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    sys.exit(main())
