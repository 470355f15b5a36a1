"""Does `starvecheck attach PID` read a running loop right? Loops with a known data-wait
share (tests/loops/attach_loop.py times its own wait with perf_counter and writes its
totals after every step), each started apart, read by attach for --duration seconds;
the loop's own share over the same seconds beside attach's, and the link attach names.

    python benchmarks/attach_accuracy.py [--duration 10]

Targets (exit 1 when missed): the share within 0.05 of the loop's own, the right
bound named, the slow rank of a two-rank gloo job under torchrun named.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "tests" / "loops" / "attach_loop.py"
sys.path.insert(0, str(LOOP.parent))
from loopstate import attach_beside, data_share, own_share, stop_tree  # noqa: E402

# mode -> (what the loop is, the words attach.loader-bound's title must hold; None: no
# such finding, the loop is not input-bound)
CASES = {
    "data": ("num_workers=0, CPU work in __getitem__", "loads in the training process"),
    "compute": ("num_workers=0, a 60 ms step, 0.4 ms of loading", None),
    "cpu": ("2 workers burning CPU", "CPU-bound"),
    "io": ("2 workers blocked in sleep", "I/O-bound"),
    "handover": ("2 workers sending 32 MiB of numpy a batch", "hand-over-bound"),
}
TOLERANCE = 0.05


def _start(cmd: list[str], path: Path) -> subprocess.Popen:
    p = subprocess.Popen(cmd, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    while not path.exists():
        if p.poll() is not None:
            raise SystemExit(f"{cmd}: exited {p.returncode}")
        time.sleep(0.1)
    time.sleep(2.0)
    return p


def _attach(pid: int, seconds: float, paths: list[Path]) -> tuple[dict, list, list]:
    """attach's stage, and the loops' totals when its sampler started and ended."""
    cmd = [sys.executable, "-m", "starvecheck", "attach", str(pid), "--duration",
           f"{seconds:g}", "--json", "-"]  # fmt: skip
    r, before, after = attach_beside(cmd, paths)
    if r.returncode not in (0, 1):
        raise SystemExit(f"attach exited {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)["stages"][0], before, after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    a = parser.parse_args()
    rows, missed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for mode, (what, words) in CASES.items():
            path = Path(tmp) / f"{mode}.json"
            p = _start([sys.executable, str(LOOP), mode, str(path)], path)
            try:
                stage, (before,), (after,) = _attach(p.pid, a.duration, [path])
            finally:
                stop_tree(p)
            own = own_share(before, after)
            got = data_share(stage, p.pid)
            found = {f["id"]: f for f in stage["findings"]}
            bound = found.get("attach.loader-bound", {}).get("title")
            named = bound is None if words is None else bool(bound and words in bound)
            ok = abs(got - own) <= TOLERANCE and named
            missed += [] if ok else [mode]
            rows.append(f"| {mode} | {what} | {own:.3f} | {got:.3f} | {got - own:+.3f} | "
                        f"{bound or 'not input-bound'} | {'ok' if ok else 'MISSED'} |")  # fmt: skip
            print(rows[-1], flush=True)
        path = Path(tmp) / "ranks.json"
        port = str(29500 + os.getpid() % 1000)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", port, str(LOOP), "slow-rank", str(path)]  # fmt: skip
        p = _start(cmd, Path(f"{path}.1"))
        try:
            files = [Path(f"{path}.0"), Path(f"{path}.1")]
            stage, (b0, b1), (e0, e1) = _attach(p.pid, a.duration, files)
        finally:
            stop_tree(p)
        own = [own_share(b0, e0), own_share(b1, e1)]
        found = {f["id"]: f for f in stage["findings"]}
        title = found.get("attach.straggler", {}).get("title", "no straggler named")
        ok = "rank 1" in title
        missed += [] if ok else ["slow-rank"]
        ranks = {r["rank"]: r["pid"] for r in stage["parameters"]["ranks"]}
        got = [data_share(stage, ranks.get(i, -1)) for i in (0, 1)]
        diff = f"{got[0] - own[0]:+.3f} / {got[1] - own[1]:+.3f}"
        rows.append(f"| slow-rank | torchrun, 2 gloo ranks, rank 1 loads 4x slower | "
                    f"{own[0]:.3f} / {own[1]:.3f} | {got[0]:.3f} / {got[1]:.3f} | "
                    f"{diff} | {title} | {'ok' if ok else 'MISSED'} |")  # fmt: skip
        print(rows[-1], flush=True)
    print(f"\n{os.cpu_count()} CPUs, attach --duration {a.duration:g}\n")
    print("| loop | what | its own data-wait share | attach's | difference | attach names | |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
