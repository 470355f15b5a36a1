"""Does `loader --factory` measure what more workers truly give? A Dataset whose samples
each take 100 ms and no CPU (a slow network read: `time.sleep`), 4 samples a batch:
num_workers=k loads exactly k times num_workers=0's samples/s, whatever else the machine
does (sleeping needs no CPU). Issue 46 measured 211-824x for 2 workers here, counting
batches buffered before the window.

    python benchmarks/factory_sleep.py [--quick-only] [--busy]

Runs `loader --factory --workers 0,1,2 --json -` with --quick and without (the full
run: 5 rounds), and reads each run's measured ratios over num_workers=0 (`vs_current`).
Targets (exit status 1 when missed): 2 workers at 2x within 20% and 1 worker at 1x
within 20%, quick and full; the worker count named (or none, with its reason) the same
in both; no caveat `loader.disturbed`. --busy burns one CPU throughout (the answer must
not move: the workers sleep). The quick run takes about half a minute, the full one
about three: run it on a quiet machine. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

SLEEPY = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Sleepy(Dataset):
        def __len__(self):
            return 2000

        def __getitem__(self, i):
            time.sleep(0.1)
            return torch.zeros(4)


    def make():
        return DataLoader(Sleepy(), batch_size=4)
    """
)
WITHIN = 0.20


def run(spec: str, quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "starvecheck", "loader", "--factory", spec]
    cmd += ["--workers", "0,1,2", "--json", "-"] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
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
        "title": own["title"],
        "disturbed": any("A disturbed measurement" in c for c in stage["caveats"]),
        "reread": stage["parameters"].get("reread") or [],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick-only", action="store_true", help="skip the full run")
    p.add_argument("--busy", action="store_true", help="burn one CPU throughout")
    args = p.parse_args()
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    missed = []
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sleepy.py"
            path.write_text(SLEEPY)
            runs = {"quick": run(f"{path}:make", True)}
            if not args.quick_only:
                runs["full"] = run(f"{path}:make", False)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    for name, r in runs.items():
        two, one = r["ratios"].get(2), r["ratios"].get(1)
        rows.append(
            f"| {name} | {one or 'none'} | {two or 'none'} | {r['count']} | "
            f"{len(r['reread'])} | {r['title']} |"
        )
        for k, got in ((1, one), (2, two)):
            if got is None or abs(got / k - 1) > WITHIN:
                missed.append(f"{name}: {k} workers at {got}x, not {k}x within {WITHIN:.0%}")
        if r["disturbed"]:
            missed.append(f"{name}: a disturbed measurement was said")
    if len({r["count"] for r in runs.values()}) > 1:
        missed.append("quick and full named different counts")
    print(
        f"sleep-bound Dataset, 100 ms a sample, 4 a batch{' (one CPU burned)' if args.busy else ''}"
    )
    print("| run | 1 worker over 0 | 2 workers over 0 | count | re-read | finding |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    for m in missed:
        print("MISSED:", m, file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    sys.exit(main())
