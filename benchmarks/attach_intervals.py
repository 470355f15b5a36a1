"""Do attach's 95% intervals hold the truth 95% of the time? (issue 57, part 5: intervals
that mean 95%)

Loops whose wait for data comes in long runs, and one whose wait is fine-grained
(tests/loops/attach_loop.py, each timing its own waits with perf_counter and logging
each wait's wall-clock start and end, WAIT_LOG):

  bursts  num_workers=0, a 300-800 ms read every 3-9 samples (both drawn), an 80 ms
          step: about half the time waiting, in runs of different lengths
  bursty  num_workers=0, every 10th sample a 0.4 s read, a 40 ms step: runs all alike
  data    num_workers=0, 4 ms of CPU a sample, batches of 8, a 10 ms step: a wait
          much longer than a step, sampled many times a wait (fine-grained against
          the bursts' seconds, but a run of samples all the same)

each read by `starvecheck attach PID --duration SECONDS` in repeated windows. For each
window: attach's data-wait share, its interval (core/intervals.worth, from the samples
in the order taken), the samples and what they were worth; the loop's own share over
the seconds attach sampled (its waits' overlap with the window, from py-spy seen
starting to seen ending, tests/loops/loopstate.attach_beside); and, for comparison,
Wilson's interval on every sample as if independent. At the end, the loop's share over
the whole run (every window and the gaps between): the job's share, which a window's
interval is for too.

    python benchmarks/attach_intervals.py [--windows 20] [--seconds 10] [--only bursts]

Target (exit 1 when missed): attach's intervals hold the loop's own share over the
window in at least 90% of every loop's windows. Prints a Markdown table.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "tests" / "loops" / "attach_loop.py"
sys.path.insert(0, str(LOOP.parent))
sys.path.insert(0, str(ROOT / "src"))
from loopstate import attach_beside, stop_tree  # noqa: E402

from starvecheck.core.intervals import wilson  # noqa: E402

TARGET = 0.90
LOOPS = {
    "bursts": "a 300-800 ms read every 3-9 samples, an 80 ms step",
    "bursty": "every 10th sample a 0.4 s read, a 40 ms step",
    "data": "4 ms of CPU a sample, batches of 8, a 10 ms step",
}


def waits(log: Path) -> list[tuple[float, float]]:
    out = []
    for line in log.read_text().splitlines():
        a, _, b = line.partition(" ")
        try:
            out.append((float(a), float(b)))
        except ValueError:
            continue
    return out


def share(log: Path, start: float, end: float) -> float:
    """The loop's own data-wait share over [start, end] (wall clock)."""
    got = sum(max(0.0, min(b, end) - max(a, start)) for a, b in waits(log))
    return got / (end - start)


def window(pid: int, seconds: float, state: Path, log: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "starvecheck", "attach", str(pid), "--duration",
           f"{seconds:g}", "--json", "-"]  # fmt: skip
    span: list[float] = []
    r, _, _ = attach_beside(cmd, [state], window=span)
    time.sleep(0.3)  # the wait under way at the end, logged
    if r.returncode not in (0, 1):
        raise SystemExit(f"attach exited {r.returncode}: {r.stderr.strip()}")
    stage = json.loads(r.stdout)["stages"][0]
    values = {m["name"]: m for m in stage["metrics"]}
    m = values["attach.main.data"]
    lab = m["labels"]
    n = float(lab["samples"])
    rate = float(values["attach.sampler.rate"]["value"])
    low_w, high_w = wilson(m["value"] * n, n)
    return {
        "truth": share(log, span[0], span[1]),
        "share": m["value"],
        "low": lab["low95"],
        "high": lab["high95"],
        "n": n,
        "eff": float(lab.get("samples_effective", n)),
        "runs": float(lab.get("runs", 0)),
        "low_w": low_w,
        "high_w": high_w,
        "seen_s": span[1] - span[0],
        "sampled_s": n / rate if rate else 0.0,
        "rate": rate,
    }


def run(mode: str, windows: int, seconds: float) -> tuple[list[dict[str, float]], float]:
    """Every window's figures, and the loop's share over the whole run."""
    with tempfile.TemporaryDirectory() as tmp:
        state, log = Path(tmp) / "state", Path(tmp) / "waits"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WAIT_LOG": str(log)}
        p = subprocess.Popen([sys.executable, str(LOOP), mode, str(state), "7200"],
                             start_new_session=True, env=env, cwd=LOOP.parent)  # fmt: skip
        try:
            while not state.exists():
                if p.poll() is not None:
                    raise SystemExit(f"the {mode} loop exited {p.returncode}")
                time.sleep(0.1)
            time.sleep(2.0)
            began = time.time()
            out = []
            for i in range(windows):
                got = window(p.pid, seconds, state, log)
                out.append(got)
                held = "held" if got["low"] <= got["truth"] <= got["high"] else "MISSED"
                print(
                    f"{mode} {i + 1}/{windows}: own {got['truth']:.3f}, attach {got['share']:.3f} "
                    f"({got['low']:.3f}-{got['high']:.3f}, {got['n']:.0f} samples at "
                    f"{got['rate']:.0f}/s worth {got['eff']:.0f}, {got['runs']:.0f} runs) "
                    f"{held}; on every sample {got['low_w']:.3f}-{got['high_w']:.3f}; "
                    f"seen {got['seen_s']:.2f} s, sampled {got['sampled_s']:.2f} s",
                    flush=True,
                )
            whole = share(log, began, time.time())
            return out, whole
        finally:
            stop_tree(p)


def row(mode: str, got: list[dict[str, float]], whole: float) -> tuple[str, float]:
    k = len(got)
    held = sum(g["low"] <= g["truth"] <= g["high"] for g in got) / k
    held_w = sum(g["low_w"] <= g["truth"] <= g["high_w"] for g in got) / k
    held_run = sum(g["low"] <= whole <= g["high"] for g in got) / k
    held_run_w = sum(g["low_w"] <= whole <= g["high_w"] for g in got) / k
    widths = sorted(g["high"] - g["low"] for g in got)
    width_w = statistics.median(g["high_w"] - g["low_w"] for g in got)
    err = statistics.median(abs(g["share"] - g["truth"]) for g in got)
    line = (
        f"| {mode} ({LOOPS[mode]}) | {k} | {held:.0%} | {held_w:.0%} | {whole:.3f}: "
        f"{held_run:.0%} | {held_run_w:.0%} | {statistics.median(widths):.3f} "
        f"({widths[0]:.3f}-{widths[-1]:.3f}) | {width_w:.3f} | "
        f"{statistics.median(g['n'] for g in got):.0f} | "
        f"{statistics.median(g['eff'] for g in got):.0f} | {err:.3f} |"
    )
    return line, held


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    rows, missed = [], []
    load = os.getloadavg()[0]
    for mode in LOOPS:
        if args.only and mode not in args.only:
            continue
        got, whole = run(mode, args.windows, args.seconds)
        line, held = row(mode, got, whole)
        rows.append(line)
        if held < TARGET:
            missed.append(f"{mode}: intervals held the loop's own share in {held:.0%} of windows")
    print(f"\nattach --duration {args.seconds:g}, {args.windows} windows a loop; "
          f"{os.cpu_count()} CPUs, load average {load:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end")  # fmt: skip
    print(
        "| loop | windows | held: attach | held: Wilson on every sample | the run's share: "
        "held by attach's | by Wilson's | attach's width, median (range) | Wilson's | "
        "samples | worth | share's error (median) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    for m in missed:
        print("MISSED:", m, file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
