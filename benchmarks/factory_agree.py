"""Does `loader --factory --quick` give the full run's advice, each within its time?
(issue 57: "the full run on the example pipelines answers in 2 minutes or less, with the
same advice as --quick"; docs/performance.md, "`loader --factory` on a sleep-bound
Dataset" and after.)

    python benchmarks/factory_agree.py [--runs 2] [--only jpeg jsonl] [--busy]

Each example pipeline (examples/jpeg_pipeline.py:imagefolder,
examples/jsonl_tokenized.py:jsonl; their data made once, before any run) is read
`--runs` times with --quick and as many times in full, alternately, `--json -`. Each
run's advice is its `loader.own-config` finding: the change it names (the settings it
changes), "could not tell" (its gain undecided: info, never a pass) or "no change" (a
pass). Targets (exit 1 when missed): every run names the same change, none passes
where another names one, --quick in 30 s or less, the full run in 120 s or less. A
run that could not tell is reported and counted apart (allowed, never a pass). --busy
burns one CPU throughout. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "jpeg": ROOT / "examples" / "jpeg_pipeline.py",
    "jsonl": ROOT / "examples" / "jsonl_tokenized.py",
}
FUNCS = {"jpeg": "imagefolder", "jsonl": "jsonl"}
QUICK_S, FULL_S = 30.0, 120.0


def advice(report: dict[str, Any], current: dict[str, Any]) -> str:
    """The run's advice in a few words: the settings its finding changes, "could not
    tell", or "no change"."""
    stage = report["stages"][0]
    f = next((f for f in stage["findings"] if f["id"] == "loader.own-config"), None)
    if f is None:
        return "no finding"
    if f["title"].startswith("Could not tell"):
        return "could not tell"
    fix = {k: v for k, v in (f.get("fix") or {}).items() if current.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in sorted(fix.items())) or "no change"


def one(name: str, quick: bool) -> tuple[str, float, str]:
    spec = f"{EXAMPLES[name]}:{FUNCS[name]}"
    cmd = [sys.executable, "-m", "starvecheck", "loader", "--factory", spec, "--json", "-"]
    cmd += ["--quick"] if quick else []
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "NO_COLOR": "1"}
    began = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    took = time.perf_counter() - began
    if out.returncode not in (0, 1):
        raise SystemExit(f"loader --factory failed on {name}: {out.stderr.strip()[-300:]}")
    report = json.loads(out.stdout)
    f = next(f for f in report["stages"][0]["findings"] if f["id"] == "loader.own-config")
    gain = (f.get("gain") or {}).get("value")
    said = advice(report, {"num_workers": 0})  # both examples start at num_workers=0
    return said, took, f"{gain:.2f}x" if isinstance(gain, (int, float)) else "-"


def make_data() -> None:
    """Each example's data, made once before any timed run."""
    for path in EXAMPLES.values():
        subprocess.run([sys.executable, str(path)], check=True, capture_output=True, timeout=900)


def burn() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--busy", action="store_true")
    args = parser.parse_args()
    make_data()
    burner = None
    if args.busy:
        burner = multiprocessing.get_context("fork").Process(target=burn, daemon=True)
        burner.start()
    rows, failed = [], 0
    try:
        for name in EXAMPLES:
            if args.only and name not in args.only:
                continue
            said: list[str] = []
            for _ in range(args.runs):
                for quick in (True, False):
                    what, took, gain = one(name, quick)
                    limit = QUICK_S if quick else FULL_S
                    ok = took <= limit
                    failed += not ok
                    said.append(what)
                    rows.append(
                        f"| {name} | {'--quick' if quick else 'full'} | {what} | {gain} "
                        f"| {took:.0f} s | {'yes' if ok else 'NO (time)'} |"
                    )
                    print(rows[-1], flush=True)
            # Every run that told names the same thing (a change, or "no change").
            agree = len({s for s in said if s != "could not tell"}) <= 1
            failed += not agree
            told = sum(s != "could not tell" for s in said)
            rows.append(
                f"| {name} | all | {' / '.join(said)} | | | "
                f"{'agree' if agree else 'NO: differ'} ({told} of {len(said)} told) |"
            )
            print(rows[-1], flush=True)
    finally:
        if burner is not None:
            burner.terminate()
    print(f"\nload: {'one CPU burner' if args.busy else 'quiet'}; runs {args.runs} each way")
    print("| example | run | advice | gain | took | ok |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
