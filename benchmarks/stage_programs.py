"""watch's stage split on training programs nobody here wrote (issue 57), set beside
each program's own clock, and what the split costs a step there.

    python benchmarks/stage_programs.py --examples DIR [--epochs 3] [--rounds 3]

--examples DIR: a checkout of https://github.com/pytorch/examples (BSD-3-Clause). Two
of its programs run as they are, on JPEGs made here (benchmarks/real_programs.py's
photograph-like images, 3200 x 2400: about 80 ms of decode each), on the CPU:
  imagenet   imagenet/main.py -a mobilenet_v3_small -b 8 -j 1 (ImageFolder, Pillow,
             RandomResizedCrop; validation and a checkpoint every epoch)
  dcgan      dcgan/main.py --dataset folder --batchSize 8 --imageSize 64 --workers 1
             --ngf 16 --ndf 16 (a step shorter than a batch's decode)
             (Resize, CenterCrop; a GAN's two steps a batch)
Each is copied with its train loader wrapped in `starvecheck.watch` and every `next()`
on it timed, as the programs' own `Data` meters do (real_programs.IMAGENET_OWN): the
program's own per-step wait, the pass's start in its first step. watch's report is
written at the end of each epoch; after --epochs epochs the split's steps (watch leaves
its warm-up out) are set beside the same last steps of the program's own clock:
  - watch's wait a step against the program's (the split's ground);
  - the split's exposed ms, summed over the stages, against watch's wait (every ms of
    the wait is given to one stage, no more);
  - the stage named, and each stage's share.
The cost: the program at steps a second (its own count over its training time)
without watch, under watch with the split off (`stages=False`) and on, in interleaved
rounds of --epochs epochs each.

Targets (docs/performance.md): watch's wait within 5% of the program's (or 2 ms); the
split's sum within 1% of watch's wait; the split on costs no step more than the noise
of the rounds (median ratios within 3%). Exit 1 where one is missed.
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
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "loops"))
from loopstate import read_state, stop_tree  # noqa: E402
from real_programs import IMAGENET_EDITS, IMAGENET_OWN, make_images  # noqa: E402

IMAGES = (3200, 2400, 160)  # long side, short side, training images: decode-bound at -j 1
WAIT_TOLERANCE = 0.05
WAIT_FLOOR_MS = 2.0
SUM_TOLERANCE = 0.01
COST_TOLERANCE = 0.03

DCGAN_EDITS = [
    (
        "import torchvision.utils as vutils\n",
        "import torchvision.utils as vutils\nimport time\n" + IMAGENET_OWN,
    ),
    (
        "shuffle=True, num_workers=int(opt.workers))\n",
        "shuffle=True, num_workers=int(opt.workers))\ndataloader = _own_watch(dataloader)\n",
    ),
    ("enumerate(dataloader, 0):", "enumerate(_own_timed(dataloader, 'train'), 0):"),
]


def prepare(checkout: Path, work: Path) -> dict[str, Path]:
    """The two instrumented copies and the images; {program: its script}."""
    out = {}
    for name, path, edits in (
        ("imagenet", "imagenet/main.py", IMAGENET_EDITS),
        ("dcgan", "dcgan/main.py", DCGAN_EDITS),
    ):
        source = (checkout / path).read_text()
        for old, new in edits:
            if source.count(old) != 1:
                raise SystemExit(f"{checkout}/{path} is not the one this script knows")
            source = source.replace(old, new)
        where = work / name
        where.mkdir()
        (where / "main_timed.py").write_text(source)
        out[name] = where / "main_timed.py"
    make_images(work / "images", IMAGES)
    return out


def command(name: str, script: Path, work: Path, epochs: int) -> list[str]:
    images = str(work / "images")
    if name == "imagenet":
        return [sys.executable, str(script), "-a", "mobilenet_v3_small", "-b", "8", "-j", "1",
                "--epochs", str(epochs), "-p", "100000000", images]  # fmt: skip
    # dcgan's folder dataset reads the training tree (its classes are ImageFolder's)
    return [sys.executable, str(script), "--dataset", "folder", "--dataroot", images + "/train",
            "--workers", "1", "--batchSize", "8", "--imageSize", "64", "--niter", str(epochs),
            "--ngf", "16", "--ndf", "16",
            "--outf", str(script.parent / "out"), "--manualSeed", "1"]  # fmt: skip


def run(name: str, script: Path, work: Path, epochs: int, mode: str) -> dict[str, Any]:
    """One run to its end: mode "none" (no watch), "off" (watch, stages=False), "on"."""
    tag = f"{name}-{mode}-{time.monotonic_ns()}"
    state, report = work / f"own-{tag}.json", work / f"watch-{tag}.json"
    env = {**os.environ, "OWN_CLOCK": str(state), "PYTHONWARNINGS": "ignore"}
    if mode != "none":
        env["WATCH_REPORT"] = str(report)
        env["WATCH_STAGES"] = "1" if mode == "on" else "0"
    p = subprocess.Popen(command(name, script, work, epochs), cwd=script.parent, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)  # fmt: skip
    try:
        _, err = p.communicate(timeout=1800)
    finally:
        stop_tree(p)
    if p.returncode != 0:
        raise SystemExit(f"{name} failed: {err.decode(errors='replace').strip()[-400:]}")
    own = read_state(state)
    steps = [float(x) for x in Path(str(state) + ".steps").read_text().split()]
    got = json.loads(report.read_text()) if mode != "none" else None
    return {"own": own, "steps": steps, "report": got}


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """watch's wait a step, the split's steps, exposed ms and share by stage."""
    wait_ms, split_steps = None, 0
    exposed: dict[str, float] = {}
    share: dict[str, float] = {}
    for m in report["stages"][0]["metrics"]:
        q = m["labels"].get("quantity")
        if q == "data_wait_ms" and wait_ms is None:  # its value is the median: the mean
            values = m.get("values") or [m["value"]]
            wait_ms = statistics.fmean(values)
        elif q == "split_steps":
            split_steps = int(m["value"])
        elif q == "exposed_ms":
            exposed[m["labels"]["load_stage"]] = m["value"]
        elif q == "exposed_share":
            share[m["labels"]["load_stage"]] = m["value"]
    return {"wait_ms": wait_ms, "steps": split_steps, "exposed": exposed, "share": share}


def beside(name: str, got: dict[str, Any]) -> tuple[str, bool]:
    f = figures(got["report"])
    n = f["steps"]
    own_ms = statistics.fmean(got["steps"][-n:]) * 1e3 if n else float("nan")
    total = sum(f["exposed"].values())
    wait = f["wait_ms"] if f["wait_ms"] is not None else float("nan")
    top = max(f["share"], key=lambda k: f["share"][k]) if f["share"] else "none"
    close = abs(wait - own_ms) <= max(WAIT_TOLERANCE * own_ms, WAIT_FLOOR_MS)
    summed = abs(total - wait) <= SUM_TOLERANCE * wait
    shares = ", ".join(
        f"{k} {v:.0%}" for k, v in sorted(f["share"].items(), key=lambda kv: -kv[1]) if v >= 0.01
    )
    row = (
        f"| {name} | {n} | {own_ms:,.1f} | {wait:,.1f} ({(wait - own_ms) / own_ms:+.1%}) | "
        f"{total:,.1f} | {top} | {shares} | {'yes' if close and summed else 'NO'} |"
    )
    return row, close and summed


def rate(got: dict[str, Any]) -> float:
    own = got["own"]
    return own["steps"] / own["train_total"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None)
    a = parser.parse_args()
    rows, costs, failed = [], [], 0
    with tempfile.TemporaryDirectory(prefix="starvecheck-programs-") as tmp:
        work = Path(tmp)
        scripts = prepare(a.examples, work)
        for name, script in scripts.items():
            if a.only and name not in a.only:
                continue
            rates: dict[str, list[float]] = {"none": [], "off": [], "on": []}
            first_on = None
            for r in range(a.rounds):
                order = ["none", "off", "on"]
                for mode in order[r % 3 :] + order[: r % 3]:
                    got = run(name, script, work, a.epochs, mode)
                    rates[mode].append(rate(got))
                    if mode == "on" and first_on is None:
                        first_on = got
            assert first_on is not None
            row, ok = beside(name, first_on)
            rows.append(row)
            print(row, flush=True)
            on = [x / y for x, y in zip(rates["on"], rates["off"], strict=True)]
            watched = [x / y for x, y in zip(rates["off"], rates["none"], strict=True)]
            cost_ok = statistics.median(on) >= 1 - COST_TOLERANCE
            failed += not (ok and cost_ok)
            step_ms = 1e3 / statistics.median(rates["on"])
            costs.append(
                f"| {name} | {step_ms:,.0f} | {statistics.median(watched):.3f} "
                f"({min(watched):.3f}-{max(watched):.3f}) | {statistics.median(on):.3f} "
                f"({min(on):.3f}-{max(on):.3f}) | {'yes' if cost_ok else 'NO'} |"
            )
            print(costs[-1], flush=True)
    print(f"\n{a.epochs} epochs a run; {a.rounds} rounds")
    print("| program | steps split | own wait ms a step | watch's wait ms | split's sum ms "
          "| stage named | shares | ok |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n| program | step ms (split on) | watch (split off) / none, steps a second "
          "| split on / off | ok |")  # fmt: skip
    print("|---|---|---|---|---|")
    print("\n".join(costs))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
