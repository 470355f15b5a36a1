"""Do `loader --factory`'s recommendations hold on pipelines nobody tuned it to, on a
machine that is not quiet? Four real pipelines (benchmarks/pipelines/: torchvision's
ImageFolder with the ImageNet example's transforms, JSONL tokenized by a fast BPE
tokenizer with DataCollatorWithPadding, WebDataset tar shards decoded with PIL, .npy
audio cropped, STFT and a mel filterbank), each:

  1. `loader --factory SPEC --quick` three times, and the full run once: the
     recommendation (its `fix`) and its predicted gain;
  2. the full run's recommendation applied to the pipeline's own DataLoader exactly as
     printed, and read against the DataLoader as the factory returns it, in a plain
     loop, in interleaved rounds (the two read in turn, each round in the other order):
     the measured gain is the median of the rounds' ratios.

    python benchmarks/real_pipelines.py [--busy] [--only vision ...] [--rounds 6]

--busy runs a process that burns one CPU through all of it (as a shared node, or a
training job beside). Targets (exit status 1 when missed): the same recommendation from
the three quick runs and the full run (agree(): the same worker count, a quick run
measuring the counts only; a run finding no change clearing its noise agrees where it
names the others' count as its best, or where none recommends a change); the
prediction within 20% of the paired measurement; no applied recommendation slower
than the pipeline as it was (the measured gain at least 0.97, the paired loop's own
noise). Prints a Markdown table
(docs/performance.md has the runs on this machine).
"""

from __future__ import annotations

import argparse
import importlib.util
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
PIPELINES = ROOT / "benchmarks" / "pipelines"
SPECS = {
    "vision": "vision.py:imagefolder",
    "text": "text.py:tokenized",
    "shards": "shards.py:dataloader",
    "audio": "audio.py:mel",
}
TOLERANCE = 0.20
NEVER_SLOWER = 0.97
SLICE_S = 3.0


@dataclass
class Verdict:
    fix: dict[str, Any]
    gain: float  # predicted; 1.0 where no change is recommended
    title: str
    seconds: float
    # The configuration the run points to: its fix where it recommends a change; where
    # no change clears the noise, the best it measured ("less certain, never contrary").
    points_to: str = ""


def factory(spec: str, *extra: str) -> Verdict:
    started = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "starvecheck",
            "loader",
            "--factory",
            str(PIPELINES / spec),
            *extra,
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=900,
    )
    if r.returncode not in (0, 1):
        raise SystemExit(f"{spec}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
    stage = json.loads(r.stdout)["stages"][0]
    own = next(f for f in stage["findings"] if f["id"] == "loader.own-config")
    gain = (own.get("gain") or {}).get("value") or 1.0
    fix = own.get("fix") or {}
    points_to = _line(fix)
    if own["title"].startswith("No change clears the noise"):
        points_to = own["title"].split("the best measured, ")[1].split(", is ")[0]
    return Verdict(fix, float(gain), own["title"], time.perf_counter() - started, points_to)


def _module(spec: str) -> Any:
    name, func = spec.split(":")
    sys.path.insert(0, str(PIPELINES))
    s = importlib.util.spec_from_file_location(f"bench_{name[:-3]}", PIPELINES / name)
    assert s is not None and s.loader is not None
    m = importlib.util.module_from_spec(s)
    s.loader.exec_module(m)
    return getattr(m, func)


def applied(dl: Any, fix: dict[str, Any]) -> Any:
    """The user's DataLoader with the recommendation's settings, the rest as it was."""
    from torch.utils.data import DataLoader, IterableDataset

    kw: dict[str, Any] = {
        "batch_size": dl.batch_size,
        "collate_fn": dl.collate_fn,
        "drop_last": dl.drop_last,
        "pin_memory": bool(fix.get("pin_memory", dl.pin_memory)),
        "num_workers": int(fix.get("num_workers", dl.num_workers)),
    }
    if not isinstance(dl.dataset, IterableDataset):
        kw["sampler"] = dl.sampler
    if kw["num_workers"]:
        kw["prefetch_factor"] = int(fix.get("prefetch_factor", 2))
        kw["persistent_workers"] = bool(fix.get("persistent_workers", False))
    return DataLoader(dl.dataset, **kw)


def _samples(batch: Any) -> int:
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        batch = next(iter(batch.values()))
    if isinstance(batch, list | tuple):
        batch = batch[0]
    return int(batch.shape[0])


def rate(loader: Any, seconds: float) -> float:
    """samples/s of a plain loop over `loader` for `seconds`, after its first batches
    (workers' start), across epochs as a training loop reads it."""
    it = iter(loader)
    warm = 1 + getattr(loader, "num_workers", 0) * 2
    for _ in range(warm):
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        try:
            n += _samples(next(it))
        except StopIteration:
            it = iter(loader)
    took = time.perf_counter() - start
    del it
    return n / took


def paired(spec: str, fix: dict[str, Any], rounds: int) -> tuple[float, float, float]:
    """(measured gain, low, high): the recommendation over the pipeline as it was,
    round by round (the median of the rounds' ratios, as `loader --factory` reads its
    own, and the rounds' range)."""
    make = _module(spec)
    before = make()
    after = applied(make(), fix)
    ratios = []
    for r in range(rounds):
        pair = (before, after) if r % 2 == 0 else (after, before)
        got = {id(x): rate(x, SLICE_S) for x in pair}
        ratios.append(got[id(after)] / got[id(before)])
    return statistics.median(ratios), min(ratios), max(ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", action="store_true", help="burn one CPU throughout")
    parser.add_argument("--only", nargs="*", choices=sorted(SPECS))
    parser.add_argument("--rounds", type=int, default=6)
    a = parser.parse_args()
    sys.path.insert(0, str(PIPELINES))
    import pipedata

    for part in pipedata.PARTS:
        pipedata.ensure(part)
    burner = None
    if a.busy:
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)
    rows, missed = [], []
    try:
        for name in a.only or SPECS:
            spec = SPECS[name]
            quick = [factory(spec, "--quick") for _ in range(3)]
            full = factory(spec)
            same = agree((*quick, full))
            certain = sum(1 for v in (*quick, full) if v.gain != 1.0)
            measured, low, high = (
                paired(spec, full.fix, a.rounds) if full.gain != 1.0 else (1.0, 1.0, 1.0)
            )
            error = full.gain / measured - 1
            ok = same and abs(error) <= TOLERANCE and measured >= NEVER_SLOWER
            if not ok:
                missed.append(name)
            line = (
                f"| {name} | `{_line(full.fix)}` | "
                + ", ".join(f"{v.gain:.2f}x" if v.gain != 1.0 else "no change" for v in quick)
                + f" | {full.gain:.2f}x | {measured:.2f}x ({low:.2f}-{high:.2f}) | "
                f"{error:+.0%} | {'yes' if same else 'NO'} ({certain} of 4 clear the noise) | "
                f"{statistics.median(v.seconds for v in quick):.0f} s / {full.seconds:.0f} s | "
                f"{'ok' if ok else 'MISSED'} |"
            )
            rows.append(line)
            print(line, flush=True)
            if not same:
                said = "; ".join(f"{v.points_to} ({v.gain:.2f}x)" for v in (*quick, full))
                print(f"  {name}: the four runs' lines: {said}", flush=True)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    load = "one CPU burned by another process" if a.busy else "quiet"
    print(f"\n{load}, {os.cpu_count()} CPUs")
    print(
        "(no change: the run found no change clearing its noise; it agrees where it names "
        "the others' line as the best it measured, or where no run recommends a change)\n"
    )
    print(
        "| pipeline | recommendation (full run) | quick x3 predicted | full predicted | "
        "applied, measured (rounds' range) | error | same 4 times | time quick / full | |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for line in rows:
        print(line)
    if missed:
        print(f"\nmissed the targets: {', '.join(missed)}")
    return 1 if missed else 0


def agree(runs: tuple[Verdict, ...]) -> bool:
    """The same recommendation from every run: every run that recommends a change
    recommends the same worker count, and a run that finds no change clearing its noise
    names that count as the best it measured (less certain, never contrary). A quick
    run measures the counts only (`loader.quick-counts`), so a run's line is read by its
    count: the full run's settings second to the count are its own to add. Where no run
    recommends a change, they agree: each says to keep the settings (the best it
    measured inside the noise may differ; it is not recommended)."""
    changes = {_count(_line(v.fix)) for v in runs if v.gain != 1.0}
    if not changes:
        return True
    if len(changes) > 1:
        return False
    (count,) = changes
    return all(_count(v.points_to) == count for v in runs)


def _count(line: str) -> str:
    """`num_workers=2` of `num_workers=2, prefetch_factor=4`; a line without a count
    as it is."""
    return next((p for p in line.split(", ") if p.startswith("num_workers=")), line)


def _line(fix: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in fix.items()) or "no change"


if __name__ == "__main__":
    raise SystemExit(main())
