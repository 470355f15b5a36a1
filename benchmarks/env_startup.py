"""Wall time of `starvecheck env` against `python -m torch.utils.collect_env`.

Both are run as a person runs them, as fresh processes, after one warm-up each
(so both read a warm page cache), then `--runs` times; the report gives median,
min … max and stdev for each, and the ratio of medians measured in this one run.

Target (README): `starvecheck env` under 0.5 s on a 2-core machine with torch
installed and no GPU.

    python benchmarks/env_startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 0.5


def _starvecheck_command(extra: list[str]) -> list[str]:
    # The console script next to this interpreter is what `make run` puts on PATH.
    script = Path(sys.executable).with_name("starvecheck")
    if script.exists():
        return [str(script), "env", *extra]
    found = shutil.which("starvecheck")
    return [found, "env", *extra] if found else [sys.executable, "-m", "starvecheck", "env", *extra]


def time_command(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    values = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        values.append(time.perf_counter() - start)
    return values


def line(name: str, values: list[float]) -> str:
    med = statistics.median(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return (
        f"{name:<44} {med * 1000:7.0f} ms  (min {min(values) * 1000:.0f} … max "
        f"{max(values) * 1000:.0f}, σ {sd * 1000:.0f}, n={len(values)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    cases = {
        "starvecheck env (terminal report)": _starvecheck_command([]),
        "starvecheck env --json -": _starvecheck_command(["--json", "-"]),
        "python -m torch.utils.collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
    }
    results = {name: time_command(cmd, args.runs) for name, cmd in cases.items()}
    for name, values in results.items():
        print(line(name, values))
    ours = statistics.median(results["starvecheck env (terminal report)"])
    theirs = statistics.median(results["python -m torch.utils.collect_env"])
    print(
        f"\nstarvecheck env ran {theirs / ours:.1f} times faster than collect_env "
        f"(medians, this run)."
    )
    verdict = "meets" if ours < TARGET_S else "MISSES"
    print(
        f"starvecheck env median {ours * 1000:.0f} ms {verdict} the "
        f"{TARGET_S * 1000:.0f} ms target."
    )
    return 0 if ours < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
