"""Does watch name the stage that holds a loop back, and does that stage's fix come
true? (issue 57; docs/performance.md, "The wait by stage")

Each scenario of benchmarks/pipelines/stages.py is built so that one stage of loading
dominates the wait. For each:
  1. the loop runs under `starvecheck.watch` (a sleep is the GPU step: it leaves the
     CPUs free, as a GPU step does), and the stage with the largest exposed share is
     read, with the data-bound finding's fix (its `fix`, the DataLoader setting it
     names) and its predicted speed-up;
  2. the fix is applied exactly as the finding states it, and the loop as it was and
     the loop with the fix run in interleaved rounds (each round in the other order),
     without watch; the measured speed-up is the median of the rounds' ratios of steps
     a second over the same passes (worker start-up included where passes restart);
  3. with --trainer the same pipeline is trained by a real lightning.Trainer with
     LightningCallback (three epochs: its first epoch's workers are made before any
     hook), and the stage the callback names is read;
  4. with --trainer-fix, the callback's own finding is checked on Lightning itself: the
     trainer as made (the callback's stage, fix and predicted speed-up) and with that
     fix, in interleaved rounds, the measured speed-up the median of the rounds' ratios
     of the callback's mean step; with --hf as well, on transformers.Trainer with
     TransformersCallback (the scenario's DataLoader as accelerate prepares it, over its
     first batches: three epochs as Lightning's; its hooks see no batch); each trainer's
     program freezes its heap once set up (FROZEN, below);
  5. with --factory, `starvecheck loader --factory stages.py:NAME --step-ms STEP` (the
     full run) reads the same pipeline: the stage its table gives the largest share of
     your settings' wait, the change its finding names and the training figure it
     predicts for the step; that change is applied in the loop as in 2, in its own
     interleaved rounds.

    python benchmarks/stage_split.py [--rounds 3] [--busy] [--trainer] [--trainer-fix [--hf]]
        [--factory] [--only NAME ...]

--busy runs a process that keeps one CPU busy throughout (the figures beside other
work). Targets (exit 1 when missed): the named stage is the scenario's; the applied fix
within 15% of its prediction and never slower (0.97x or more); loader --factory's full
run in 120 s or less. Prints a Markdown table.

Every process's Python work (benchmarks/pipelines/stages.py, python_work) records its CPU
time: each row says the machine's speed at that work (µs of CPU a round) while its
loops ran. A CPU that runs the same work at two speeds, in episodes of seconds, moves a
loop without any change to the loader (docs/performance.md, "A machine at two speeds");
a watch round whose two loops' speeds part by more than SAME_SPEED is retaken, up to
--rounds times, and the row says how many were.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "pipelines"))

import stages as pipelines  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import starvecheck  # noqa: E402
from starvecheck.core.metric import select  # noqa: E402
from starvecheck.core.schema.loading import EXPOSED_SHARE  # noqa: E402

warnings.filterwarnings("ignore", message="This DataLoader will create")
TOLERANCE = 0.15
WARMUP = 3  # steps of the first pass left out of the benchmark's own clock


@dataclass(frozen=True)
class Scenario:
    name: str
    stage: str  # the stage that dominates, by construction
    step_ms: float  # the GPU step, a sleep
    steps: int  # a pass's steps
    passes: int = 1


SCENARIOS = (
    Scenario("read", "read", 20.0, 60),
    Scenario("transform", "transform", 20.0, 40),
    Scenario("collate", "collate", 20.0, 40),
    Scenario("handover", "handover", 5.0, 40),
    Scenario("startup", "startup", 10.0, 16, passes=4),
)


def loop(loader: DataLoader, s: Scenario, watched: bool) -> tuple[float, Any]:
    """s.passes passes of s.steps steps; (seconds a step, the report where watched).
    One pass: its first WARMUP steps are left out of the clock (the run's own start).
    More: the first pass is left out whole and the later ones counted whole, each with
    its start, as every epoch after a job's first pays it (a pass's steps and its one
    restart: the steady state the predictions are for; counting the first pass's steps
    without its start put 3 restarts over 61 steps, not one in 16)."""
    source: Any = starvecheck.watch(loader, show=False) if watched else loader
    begun = None
    steps = 0
    for p in range(s.passes):
        if p == 1:
            begun = time.perf_counter()
        for n, _batch in enumerate(source):
            time.sleep(s.step_ms / 1e3)
            if s.passes == 1 and n + 1 == WARMUP:
                begun = time.perf_counter()
            elif begun is not None:
                steps += 1
            if n + 1 >= s.steps:
                break
    assert begun is not None
    per_step = (time.perf_counter() - begun) / steps
    return per_step, source.report() if watched else None


def named(report: Any) -> tuple[str, Any]:
    """(the stage with the largest exposed share, the data-bound finding)."""
    stage = report.stages[0]
    shares = {
        m.labels["load_stage"]: m.value for m in select(stage.figures, quantity=EXPOSED_SHARE)
    }
    top = max(shares, key=lambda k: shares[k]) if shares else "none"
    finding = next(f for f in report.checklist if f.id == "profile.data-bound")
    return str(top), finding


@dataclass
class Rounds:
    """A scenario's interleaved rounds: the last round's stage and finding, and each
    kept round's prediction, seconds a step before and after, and the machine's speed at
    the pipeline's Python work in each of its two loops (µs a round; None: no such work)."""

    top: str = "none"
    finding: Any = None
    predicted: list[float] = field(default_factory=list)
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    speeds: list[tuple[float | None, float | None]] = field(default_factory=list)
    retaken: int = 0

    def machine(self) -> str:
        """The speeds, median before / after, and the rounds retaken."""
        b = [x for x, _ in self.speeds if x is not None]
        a = [y for _, y in self.speeds if y is not None]
        if not b or not a:
            return "-"
        said = f"{statistics.median(b):.0f} / {statistics.median(a):.0f} µs"
        return said + (f", {self.retaken} retaken" if self.retaken else "")


def rounds_of(s: Scenario, rounds: int) -> Rounds:
    """Interleaved rounds, each in the other order: the loop as it is under watch (the
    stage it names, its finding's fix and predicted speed-up) and the loop with that
    fix applied, without watch. A prediction and the measurement it is checked against
    come from the same round, seconds apart: a machine whose other work comes and goes
    moves both alike. A round whose two loops ran the same Python work at speeds apart
    by more than SAME_SPEED checks nothing (the machine changed under it, not the
    loader): it is retaken, up to `rounds` times, and counted."""
    make = getattr(pipelines, s.name)
    out, r = Rounds(), 0
    fix: dict[str, Any] = {}
    while len(out.before) < rounds:
        steps: dict[bool, float] = {}
        speeds: dict[bool, float | None] = {}
        gain_now = 1.0
        for fixed in (False, True) if r % 2 == 0 or not fix else (True, False):
            if fixed and not fix:
                continue
            mark = speed_mark()
            if not fixed:
                steps[False], report = loop(make(), s, watched=True)
                out.top, out.finding = named(report)
                fix = dict(out.finding.fix or {})
                gain = out.finding.gain
                kind = gain.kind.value if gain is not None else None
                gain_now = gain.value if kind == "throughput" and gain.value else 1.0
            else:
                steps[True] = loop(make(**fix), s, watched=False)[0]
            speeds[fixed] = speed_since(mark)
        r += 1
        if moved(speeds.get(False), speeds.get(True)) and out.retaken < rounds:
            out.retaken += 1
            after = f"{steps[True] * 1e3:.1f} ms" if True in steps else "-"
            print(f"retaken: {s.name}: {speeds[False]:.0f} / {speeds[True]:.0f} µs a round; "
                  f"{gain_now:.2f}x predicted, {steps[False] * 1e3:.1f} -> {after}",
                  file=sys.stderr, flush=True)  # fmt: skip
            continue
        out.predicted.append(gain_now)
        out.before.append(steps[False])
        if True in steps:
            out.after.append(steps[True])
        out.speeds.append((speeds.get(False), speeds.get(True)))
    return out


SPEED_FILE: list[str] = []
# Two loops' speeds at the same Python work within this factor: the same machine.
SAME_SPEED = 1.15


def speed_mark() -> int:
    return os.path.getsize(SPEED_FILE[0]) if SPEED_FILE else 0


def speed_since(mark: int) -> float | None:
    return pipelines.speed(SPEED_FILE[0], mark) if SPEED_FILE else None


def speed_read(mark: int) -> list[float]:
    """The speed since `mark` as a list to add to: empty where there was no such work."""
    got = speed_since(mark)
    return [] if got is None else [got]


def moved(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and max(a, b) > SAME_SPEED * min(a, b)


LIGHTNING = """
import gc, json, sys
sys.path.insert(0, {pipelines!r})
import lightning as L, torch, stages, time
from starvecheck.integrations import LightningCallback

class Step(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
    def training_step(self, batch, i):
        time.sleep({step_s})
        return (self.w * 0).sum() + self.w.sum() * 0
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

cb = LightningCallback(show=False)
trainer = L.Trainer(max_epochs=3, limit_train_batches={steps}, accelerator="cpu", logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[cb])
gc.freeze()  # the set-up's heap out of the collector's full passes (see FROZEN)
trainer.fit(Step(), stages.{name}(**{fix!r}))
report = cb.watch.report()
result = report.stages[0]
shares = {{m.labels["load_stage"]: m.value for m in result.figures
          if m.labels.get("quantity") == "exposed_share"}}
step_ms = next(m for m in result.figures if m.labels.get("quantity") == "step_ms")
later = step_ms.values[{steps} - 1:]  # the later epochs (the first step is left out)
step = sum(later) / len(later)  # the mean, as the prediction's step
found = next((f for f in report.checklist if f.id == "profile.data-bound"), None)
gain = found.gain if found is not None and found.gain is not None else None
print("SHARES", json.dumps(shares))
print("READ", json.dumps({{"step_ms": step, "fix": dict(found.fix or {{}}) if found else {{}},
      "gain": gain.value if gain is not None and gain.kind.value == "throughput" else None}}))
"""


TRANSFORMERS = """
import gc, json, sys
sys.path.insert(0, {pipelines!r})
import torch, stages, time
from transformers import Trainer, TrainingArguments
from starvecheck.integrations import TransformersCallback

class Step(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

# The scenario's DataLoader, settings and all, over its first `steps` batches: a
# transformers epoch is its DataLoader's length (Lightning's limit_train_batches).
def epoch(loader, steps):
    n = steps * (loader.batch_size or 1)
    return torch.utils.data.DataLoader(
        torch.utils.data.Subset(loader.dataset, range(n)), batch_size=loader.batch_size,
        num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        persistent_workers=loader.persistent_workers,
        multiprocessing_context=loader.multiprocessing_context)

class Made(Trainer):  # the scenario's own DataLoader, as accelerate prepares it
    def get_train_dataloader(self):
        return self.accelerator.prepare(epoch(stages.{name}(**{fix!r}), {steps}))
    def _get_num_items_in_batch(self, batch_samples, device):
        return None  # the batches are tensors, not dicts with labels
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        time.sleep({step_s})
        return model.w.sum() * 0

cb = TransformersCallback(show=False)
args = TrainingArguments(output_dir="/tmp/stage-split-hf", num_train_epochs=3, report_to=[],
                         save_strategy="no", logging_strategy="no", use_cpu=True,
                         disable_tqdm=True)
gc.freeze()  # the set-up's heap out of the collector's full passes (see FROZEN)
Made(model=Step(), args=args, train_dataset=[0], callbacks=[cb]).train()
report = cb.watch.report()
result = report.stages[0]
shares = {{m.labels["load_stage"]: m.value for m in result.figures
          if m.labels.get("quantity") == "exposed_share"}}
step_ms = next(m for m in result.figures if m.labels.get("quantity") == "step_ms")
later = step_ms.values[{steps} - 1:]
step = sum(later) / len(later)
found = next((f for f in report.checklist if f.id == "profile.data-bound"), None)
gain = found.gain if found is not None and found.gain is not None else None
print("SHARES", json.dumps(shares))
print("READ", json.dumps({{"step_ms": step, "fix": dict(found.fix or {{}}) if found else {{}},
      "gain": gain.value if gain is not None and gain.kind.value == "throughput" else None}}))
"""
# FROZEN: each trainer's program freezes its heap once set up (gc.freeze()). Lightning's
# process collects its whole heap (about 300 ms here) once the objects that survived
# younger collections pass a quarter of it: at num_workers=4 (more objects made each
# epoch) that fell at step 150 of 180 in 4 runs of 4, inside a wait, and never at 2
# (gone with the collector off): one 300 ms pause in the 120 steps read, on one side
# only, put the read scenario's 1.24x at 1.06x (+20%). A long job pays such pauses on
# both sides alike; a 3-epoch run pays one or none.
TEMPLATES = {"lightning": LIGHTNING, "transformers": TRANSFORMERS}
TRAINER = ["lightning"]  # --hf: transformers.Trainer with TransformersCallback


def trainer_stage(s: Scenario) -> str:
    """The stage LightningCallback names for the scenario (its later epochs)."""
    return trainer_reads(s)[0]


def trainer_reads(s: Scenario, fix: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(the stage LightningCallback names, what it read: its mean step_ms, the data-bound
    finding's fix and predicted gain) for the scenario trained with `fix` applied."""
    code = TEMPLATES[TRAINER[0]].format(pipelines=str(HERE / "pipelines"), step_s=s.step_ms / 1e3,
                                        steps=s.steps, name=s.name, fix=fix or {})  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env
    )
    if out.returncode != 0:
        return f"failed: {out.stderr.strip().splitlines()[-1:]}", {}
    shares = json.loads(out.stdout.split("SHARES ", 1)[1].splitlines()[0])
    read = json.loads(out.stdout.split("READ ", 1)[1].splitlines()[0])
    return (max(shares, key=lambda k: shares[k]) if shares else "none"), read


def trainer_fix_row(s: Scenario, rounds: int) -> tuple[str, bool]:
    """The callback's own prediction checked on Lightning itself: the trainer as made and
    with the callback's fix, in interleaved rounds, each run's mean step on the
    callback's clock over its later epochs (every one's restart in it, as in the
    prediction's step: the first epoch's workers start before any hook); the measured
    gain the median of the rounds' ratios."""
    top, predicted, ratios, fix = "none", [], [], {}
    speeds: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        steps: dict[bool, float] = {}
        for fixed in (False, True) if r % 2 == 0 or not fix else (True, False):
            if fixed and not fix:
                continue
            mark = speed_mark()
            stage, read = trainer_reads(s, fix if fixed else None)
            steps[fixed] = float(read.get("step_ms") or 0.0)
            speeds[fixed] += speed_read(mark)
            if not fixed:
                top, fix = stage, dict(read.get("fix") or {})
                predicted.append(read.get("gain") or 1.0)
        if fix and steps.get(True):
            ratios.append(steps[False] / steps[True])
    gain = statistics.median(predicted) if predicted and fix else None
    ratio = statistics.median(ratios) if ratios else 1.0
    error = None if gain is None else gain / ratio - 1
    ok = top == s.stage and ratio >= 0.97 and error is not None and abs(error) <= TOLERANCE
    row = (
        f"| {s.name} | {top} | `{fix}` | {'none' if gain is None else f'{gain:.2f}x'} | "
        f"{ratio:.2f}x | {'-' if error is None else f'{error:+.0%}'} | "
        f"{said_speeds(speeds[False], speeds[True])} | {'yes' if ok else 'NO'} |"
    )
    return row, ok


def said_speeds(before: list[float], after: list[float]) -> str:
    """The machine's speed at the Python work, median over the runs before / after."""
    if not before or not after:
        return "-"
    return f"{statistics.median(before):.0f} / {statistics.median(after):.0f} µs"


def factory_reads(s: Scenario) -> tuple[str, dict[str, Any], float | None, float]:
    """(the stage loader --factory gives the largest share of the current settings'
    wait, the fix it names, its predicted training figure, the run's seconds)."""
    spec = f"{HERE / 'pipelines' / 'stages.py'}:{s.name}"
    cmd = [sys.executable, "-m", "starvecheck", "loader", "--factory", spec,
           "--step-ms", f"{s.step_ms:g}", "--json", "-"]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "NO_COLOR": "1"}
    began = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    took = time.perf_counter() - began
    if out.returncode not in (0, 1):
        raise SystemExit(f"loader --factory failed on {s.name}: {out.stderr.strip()[-300:]}")
    stage = json.loads(out.stdout)["stages"][0]
    shares = {
        m["labels"]["load_stage"]: m["value"]
        for m in stage["metrics"]
        if m["labels"].get("quantity") == EXPOSED_SHARE and m["labels"].get("current")
        and m["labels"].get("role") in ("current", "workers")
    }  # fmt: skip
    top = max(shares, key=lambda k: shares[k]) if shares else "none"
    f = next(f for f in stage["findings"] if f["id"] == "loader.own-config")
    current = {k: v for k, v in pipelines_settings(s).items() if k in f.get("fix", {})}
    fix = {k: v for k, v in f.get("fix", {}).items() if current.get(k) != v}
    gain = f.get("gain") or {}
    return top, fix, gain.get("value") if fix else None, took


def pipelines_settings(s: Scenario) -> dict[str, Any]:
    """The scenario's DataLoader settings as made (num_workers, persistent_workers)."""
    loader = getattr(pipelines, s.name)()
    return {"num_workers": loader.num_workers, "persistent_workers": loader.persistent_workers}


def factory_rounds(
    s: Scenario, fix: dict[str, Any], rounds: int
) -> tuple[list[float], list[float], list[float]]:
    """Seconds a step, the loop as made and with the factory's fix, in interleaved
    rounds; and the machine's speed at the Python work in each loop."""
    make = getattr(pipelines, s.name)
    before, after, speeds = [], [], []
    for r in range(rounds):
        for fixed in (False, True) if r % 2 == 0 else (True, False):
            mark = speed_mark()
            (after if fixed else before).append(loop(make(**(fix if fixed else {})), s, False)[0])
            speeds += speed_read(mark)
    return before, after, speeds


def factory_row(s: Scenario, rounds: int) -> tuple[str, bool]:
    mark = speed_mark()
    top, fix, predicted, took = factory_reads(s)
    read_at = speed_read(mark)
    before, after, speeds = factory_rounds(s, fix, rounds) if fix else ([1.0], [1.0], [])
    b, a = statistics.median(before), statistics.median(after)
    ratio = b / a
    error = None if predicted is None else predicted / ratio - 1
    ok = top == s.stage and bool(fix) and ratio >= 0.97
    ok = ok and error is not None and abs(error) <= TOLERANCE and took <= 120
    row = (
        f"| {s.name} | {top} | `{fix}` | {'none' if predicted is None else f'{predicted:.2f}x'} "
        f"| {ratio:.2f}x ({b * 1e3:.1f} -> {a * 1e3:.1f} ms) | "
        f"{'-' if error is None else f'{error:+.0%}'} | {took:.0f} s | "
        f"{said_speeds(read_at, speeds)} | {'yes' if ok else 'NO'} |"
    )
    return row, ok


def burn() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--trainer", action="store_true")
    parser.add_argument("--factory", action="store_true")
    parser.add_argument("--trainer-fix", action="store_true")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--hf", action="store_true")
    args = parser.parse_args()
    if args.hf:  # --trainer-fix on transformers.Trainer
        TRAINER[0] = "transformers"
    # The work a batch, sized once before any load: every process of the run (the loop,
    # its workers, loader --factory, Lightning's) does the same rounds.
    os.environ[pipelines.ROUND_ENV] = repr(pipelines.round_s())
    fd, path = tempfile.mkstemp(prefix="stage-split-speed-")
    os.close(fd)
    SPEED_FILE.append(path)
    os.environ[pipelines.SPEED_ENV] = path
    burner = None
    if args.busy:
        burner = multiprocessing.get_context("fork").Process(target=burn, daemon=True)
        burner.start()
    rows, failed, factory = [], 0, []
    try:
        for s in SCENARIOS:
            if args.only and s.name not in args.only:
                continue
            if args.factory or args.trainer_fix:
                row_of = factory_row if args.factory else trainer_fix_row
                row, ok = row_of(s, args.rounds)
                factory.append(row)
                failed += not ok
                print(row, flush=True)
                continue
            got = rounds_of(s, args.rounds)
            top, finding = got.top, got.finding
            fix = dict(finding.fix or {}) if finding is not None else {}
            gain = statistics.median(got.predicted) if fix else None
            b = statistics.median(got.before)
            a = statistics.median(got.after) if got.after else b
            ratio = b / a
            error = None if gain is None else gain / ratio - 1
            trainer = trainer_stage(s) if args.trainer else ""
            ok = top == s.stage and ratio >= 0.97 and (error is None or abs(error) <= TOLERANCE)
            ok = ok and (not args.trainer or trainer == s.stage) and bool(fix)
            failed += not ok
            rows.append(
                f"| {s.name} | {top} | {trainer or '-'} | `{fix}` | "
                f"{'none' if gain is None else f'{gain:.2f}x'} | {ratio:.2f}x "
                f"({b * 1e3:.1f} -> {a * 1e3:.1f} ms) | "
                f"{'-' if error is None else f'{error:+.0%}'} | {got.machine()} | "
                f"{'yes' if ok else 'NO'} |"
            )
            print(rows[-1], flush=True)
    finally:
        if burner is not None:
            burner.terminate()
        os.unlink(path)
    sized = pipelines.round_s() * 1e6
    print(f"\nload: {'one CPU burner' if args.busy else 'quiet'}; rounds {args.rounds}; "
          f"the Python work sized at {sized:.1f} µs a round")  # fmt: skip
    if args.factory:
        print("| scenario | factory names | fix | predicted | measured | error | run "
              "| µs a round (factory / loops) | ok |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(factory))
        return 1 if failed else 0
    if args.trainer_fix:
        who = f"measured ({TRAINER[0]})"
        print(f"| scenario | callback names | fix | predicted | {who} | error | µs a round | ok |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(factory))
        return 1 if failed else 0
    print("| scenario | watch names | callback names | fix | predicted | measured | error "
          "| µs a round | ok |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
