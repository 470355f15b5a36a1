"""`profile --trace` on a big trace: wall time and peak memory against `json.load`.

Builds a trace of about a million events by repeating a real one in time (each copy
shifted past the last, its steps renumbered), writes it uncompressed, then runs, each
in a fresh process (peak RSS is per process):

  starvecheck   `starvecheck profile --trace BIG --json FILE`, the whole command
  json.load     Python's json.load of the same file, nothing else
  HTA           HolisticTraceAnalysis's TraceAnalysis on it, if --hta-python names a
                Python that has it installed (not a dependency of starvecheck)

Targets (issue 17): starvecheck in less wall time than json.load, peak RSS under 3x
the file's size.

    python benchmarks/trace_scale.py [--source TRACE] [--events 1000000] [--hta-python PY]

The default source is a real trace checked in (HTA's trace_filter rank 0, MIT).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests/fixtures/traces/hta/ranks/sampled_rank-0.json.gz"
TIME = ["/usr/bin/time", "-f", "%e %M"]


def build(source: Path, events: int, out: Path) -> int:
    opener = gzip.open if source.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(source, "rb") as f:
        doc = json.load(f)
    one = doc["traceEvents"]
    timed = [e for e in one if isinstance(e.get("ts"), int | float)]
    lo = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - lo + 1000
    copies = max(1, -(-events // len(one)))
    steps = [int(e["name"][13:]) for e in one if str(e.get("name", "")).startswith("ProfilerStep#")]
    stride = max(steps) - min(steps) + 1 if steps else 0
    with open(out, "w") as f:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        f.write(json.dumps(head)[:-1] + (', "traceEvents": [' if head else '{"traceEvents": ['))
        first = True
        for k in range(copies):
            for e in one:
                e2 = dict(e)
                if "ts" in e2 and isinstance(e2["ts"], int | float):
                    e2["ts"] = e2["ts"] + k * span
                name = str(e2.get("name", ""))
                if k and name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name[13:]) + k * stride}"
                f.write(("" if first else ",") + json.dumps(e2))
                first = False
        f.write("]}")
    return copies * len(one)


def timed(cmd: list[str]) -> tuple[float, float] | str:
    """(wall s, peak RSS MiB) of a command, by GNU time; why not, where it failed."""
    r = subprocess.run(TIME + cmd, capture_output=True, text=True)
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    if r.returncode:
        killed = " (killed: out of memory?)" if r.returncode in (137, -9) else ""
        return f"failed: exit {r.returncode}{killed}"
    wall, rss_kib = last.split()
    return float(wall), int(rss_kib) / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=SOURCE)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--hta-python", help="a Python with holistictraceanalysis installed")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="starvecheck-trace-scale-") as tmp:
        big = Path(tmp) / "big.pt.trace.json"
        n = build(args.source, args.events, big)
        size = big.stat().st_size / 2**20
        print(f"trace: {n:,} events, {size:,.0f} MiB uncompressed, from {args.source.name}")
        exe = [sys.executable, "-m", "starvecheck"]
        runs = {
            "starvecheck": [
                *exe,
                "profile",
                "--trace",
                str(big),
                "--json",
                str(Path(tmp) / "r.json"),
            ],
            "json.load": [
                sys.executable,
                "-c",
                f"import json; json.load(open({str(big)!r}, 'rb'))",
            ],
        }
        if args.hta_python:
            d = Path(tmp) / "hta"
            d.mkdir()
            os.link(big, d / big.name)
            code = (
                "import logging, warnings; warnings.filterwarnings('ignore'); "
                "logging.disable(logging.WARNING); from hta.trace_analysis import TraceAnalysis; "
                f"t = TraceAnalysis(trace_dir={str(d)!r}); "
                "t.get_temporal_breakdown(visualize=False); "
                "t.get_idle_time_breakdown(visualize=False)"
            )
            runs["HTA"] = [args.hta_python, "-c", code]
        got: dict[str, tuple[float, float]] = {}
        for name, cmd in runs.items():
            samples = []
            for _ in range(args.repeat if name != "HTA" else 1):
                s = timed(cmd)
                if isinstance(s, str):
                    break
                samples.append(s)
            if not samples:
                print(f"{name:12} {s}")
                if name != "HTA":
                    return 1
                continue
            wall = statistics.median(s[0] for s in samples)
            rss = statistics.median(s[1] for s in samples)
            got[name] = (wall, rss)
            spread = max(s[0] for s in samples) - min(s[0] for s in samples)
            print(
                f"{name:12} wall {wall:6.2f} s (median of {len(samples)}, range {spread:.2f} s)  "
                f"peak RSS {rss:7,.0f} MiB = {rss / size:.2f}x the file"
            )
        sc, js = got["starvecheck"], got["json.load"]
        faster = sc[0] < js[0]
        lean = sc[1] < 3 * size
        print(
            f"starvecheck / json.load: {sc[0] / js[0]:.2f}x the wall time "
            f"({'meets' if faster else 'MISSES'} < 1); peak RSS {sc[1] / size:.2f}x the file "
            f"({'meets' if lean else 'MISSES'} < 3x)"
        )
        return 0 if faster and lean else 1


if __name__ == "__main__":
    raise SystemExit(main())
