"""Live advice on a machine that is not empty (issue 46, docs/architecture.md principle 9): do the
worker counts that `attach` and `watch` recommend while other processes hold the CPUs
come true when applied?

Each scenario runs a loop in a process of its own, beside burner processes that take a
set number of CPUs (a fraction is a duty cycle), reads the advice, then applies it: the
loop as it was and the loop with the recommended num_workers are run in interleaved
rounds (each round in the other order) under the same burners, and their steps a second
are compared round by round.

    python benchmarks/live_busy.py [--rounds 4] [--seconds 8] [--only NAME ...]

Scenarios:
  attach-busy   one DataLoader worker doing CPU work (8 samples of 5 ms a batch), a
                10 ms CPU step; other processes take 1.2 of the CPUs; `attach PID`
  watch-busy    num_workers=0, 8 samples of 3 ms of Python work a batch, a 20 ms sleep
                step, under `starvecheck.watch`; other processes keep the load average
                near 6 on 2 CPUs (six burners)
  watch-quiet   the same loop with nothing else running (the model must still advise)

Target: every applied recommendation never slower (0.97x or more) and within 20% of its
prediction, or no figure given with the reason. Exit 1 when a scenario misses it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "loops"))
from loopstate import advised_workers, read_state, stop_tree  # noqa: E402

TOLERANCE = 0.20


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def burn(fraction: float) -> None:
    """Keep `fraction` (0-1] of a CPU busy for ever: spin, then sleep, in 10 ms periods."""
    period = 0.01
    while True:
        spin(period * fraction)
        if fraction < 1:
            time.sleep(period * (1 - fraction))


def loop(mode: str, workers: int, state: str) -> None:
    """A training loop writing its steps and time to `state` after every step."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    sample_s, step_s, sleep_step = {
        "attach-busy": (0.005, 0.010, False),
        "watch-busy": (0.003, 0.020, True),
        "watch-quiet": (0.003, 0.020, True),
    }[mode]

    class Work(Dataset):
        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, i: int) -> Any:
            spin(sample_s)
            return torch.zeros(8)

    dl = DataLoader(Work(), batch_size=8, num_workers=workers)
    if mode.startswith("watch"):
        import starvecheck

        it_src = starvecheck.watch(dl, show=False, every=None)
    else:
        it_src = dl
    it = iter(it_src)
    next(it)
    t0, steps = time.perf_counter(), 0
    report_path = state + ".report.json"
    deadline = t0 + float(os.environ.get("LIVE_BUSY_SECONDS", "600"))
    while time.perf_counter() < deadline:
        try:
            next(it)
        except StopIteration:
            break
        time.sleep(step_s) if sleep_step else spin(step_s)
        steps += 1
        with open(state + ".tmp", "w") as f:
            json.dump({"steps": steps, "total": time.perf_counter() - t0}, f)
        os.replace(state + ".tmp", state)
    if mode.startswith("watch"):
        del it
        report = it_src.report()
        Path(report_path).write_text(json.dumps(report.to_dict()))


def _start_loop(mode: str, workers: int, state: Path, seconds: float) -> subprocess.Popen:
    env = {**os.environ, "LIVE_BUSY_SECONDS": str(seconds)}
    cmd = [sys.executable, __file__, "--loop", mode, str(workers), str(state)]
    p = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.time() + 120
    while not state.exists():
        if p.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the {mode} loop did not start")
        time.sleep(0.1)
    return p


def rate(mode: str, workers: int, seconds: float, tmp: Path) -> float:
    """The loop's steps a second over `seconds`, after 2 s of warm-up."""
    state = tmp / f"rate-{mode}-{workers}-{time.monotonic_ns()}.json"
    p = _start_loop(mode, workers, state, seconds + 30)
    try:
        time.sleep(2.0)
        a = read_state(state, tries=200)
        time.sleep(seconds)
        b = read_state(state, tries=200)
    finally:
        stop_tree(p)
    return (b["steps"] - a["steps"]) / (b["total"] - a["total"])


@dataclass
class Outcome:
    scenario: str
    said: str
    predicted: float | None
    measured: float | None
    rounds: list[float]

    @property
    def ok(self) -> bool:
        if self.measured is None:
            return True  # no change recommended
        if self.measured < 0.97:
            return False
        return self.predicted is None or abs(self.predicted / self.measured - 1) <= TOLERANCE


Advice = tuple[int | None, float | None, str]  # num_workers, predicted gain, what was said


def advise_attach(mode: str, workers: int, tmp: Path, seconds: float) -> Advice:
    state = tmp / "advise.json"
    p = _start_loop(mode, workers, state, seconds + 60)
    try:
        time.sleep(3.0)
        cmd = [sys.executable, "-m", "starvecheck", "attach", str(p.pid), "--json", "-",
               "--duration", str(round(seconds))]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        if r.returncode not in (0, 1):
            raise RuntimeError(r.stderr.strip())
        findings = json.loads(r.stdout)["stages"][0]["findings"]
    finally:
        stop_tree(p)
    return advised_workers(findings, ("attach.loader-bound",))


def advise_watch(mode: str, workers: int, tmp: Path, seconds: float) -> Advice:
    state = tmp / "advise-watch.json"
    env = {**os.environ, "LIVE_BUSY_SECONDS": str(seconds)}
    cmd = [sys.executable, __file__, "--loop", mode, str(workers), str(state)]
    subprocess.run(cmd, env=env, check=True, timeout=seconds + 120)
    report = json.loads(Path(str(state) + ".report.json").read_text())
    findings = [f for s in report["stages"] for f in s["findings"]]
    findings += report.get("checklist", [])
    return advised_workers(findings, tuple({f["id"] for f in findings}))


def scenario(name: str, cpus: float, rounds: int, seconds: float, tmp: Path) -> Outcome:
    workers = 1 if name == "attach-busy" else 0
    burners = []
    whole, part = int(cpus), cpus - int(cpus)
    for fraction in [1.0] * whole + ([part] if part > 0.01 else []):
        cmd = [sys.executable, __file__, "--burn", str(fraction)]
        burners.append(subprocess.Popen(cmd, start_new_session=True))
    try:
        time.sleep(1.0)
        advise = advise_attach if name == "attach-busy" else advise_watch
        k, predicted, said = advise(name, workers, tmp, 10.0)
        if k is None or k == workers:
            return Outcome(name, said, None, None, [])
        ratios = []
        for r in range(rounds):
            pair = [workers, k] if r % 2 == 0 else [k, workers]
            got = {n: rate(name, n, seconds, tmp) for n in pair}
            ratios.append(got[k] / got[workers])
        measured = statistics.median(ratios)
        return Outcome(name, f"num_workers={k} ({said})", predicted, measured, ratios)
    finally:
        for b in burners:
            b.kill()
            b.wait()


LOADS = {"attach-busy": 1.2, "watch-busy": 6.0, "watch-quiet": 0.0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--loop", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--burn", type=float, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.burn is not None:
        burn(a.burn)
        return 0
    if a.loop:
        loop(a.loop[0], int(a.loop[1]), a.loop[2])
        return 0
    import tempfile

    outcomes = []
    with tempfile.TemporaryDirectory(prefix="live-busy-") as d:
        for name, cpus in LOADS.items():
            if a.only and name not in a.only:
                continue
            o = scenario(name, cpus, a.rounds, a.seconds, Path(d))
            outcomes.append(o)
            pred = "no figure" if o.predicted is None else f"{o.predicted:.2f}x"
            meas = "-" if o.measured is None else f"{o.measured:.2f}x"
            spread = (
                f" ({min(o.rounds):.2f}-{max(o.rounds):.2f} over {len(o.rounds)} rounds)"
                if o.rounds
                else ""
            )
            print(f"{o.scenario:<12} {o.said[:110]}\n    predicted {pred}, measured {meas}{spread}"
                  f"  {'ok' if o.ok else 'MISSED'}", flush=True)  # fmt: skip
    missed = [o.scenario for o in outcomes if not o.ok]
    if missed:
        print(f"missed (never slower, within {TOLERANCE:.0%} or no figure): {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
