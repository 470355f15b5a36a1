"""`attach` and `watch` on training programs nobody here wrote (issue 46, item 7), each
set against the program's own clock over the same seconds, quiet and with other
processes taking one and two CPUs; every change they recommend is applied and measured.

    python benchmarks/real_programs.py [--nanogpt DIR] [--imagenet DIR]
        [--seconds 10] [--window 30] [--repeats 2] [--rounds 3] [--epochs 2]
        [--loads 0 1 2]

--nanogpt DIR: a checkout of https://github.com/karpathy/nanoGPT (MIT). Its `train.py`,
unmodified, fetches batches with its own memmap `get_batch` (no DataLoader); an
instrumented copy (made here, in a temporary directory) adds up the seconds spent in
`get_batch` and writes its totals after every iteration. Its data is made here: random
uint16 tokens (4M train, 200k val) in the layout its `prepare.py` leaves. The model is
sized so that fetching is a real part of each step on a CPU (1 layer, 32 wide, batches
of 32 x 64 tokens). attach is read against that clock.

--imagenet DIR: a checkout of https://github.com/pytorch/examples (BSD-3-Clause). Its
`imagenet/main.py` (ImageFolder, Pillow decode, RandomResizedCrop, a DataLoader with
`-j` workers, validation and a checkpoint every epoch), run as `-a mobilenet_v3_small
-b 8 -j 1` on JPEGs made here: 3200 x 2400 photographs-like images (about 80 ms of
decode each: one worker is the limit) and 480 x 360 ones (the model's step is). The
instrumented copy times every `next()` (and the start of each pass) on its loaders, as
its own `Data` meter does; `watch` is read from the same copy with its train loader
wrapped in `starvecheck.watch` (the report written after each epoch). attach's and
watch's recommended num_workers are applied: the program at -j 1 and at the
recommended count, in interleaved rounds under the same load, training steps a second
by its own count over wall time (validation and checkpoints included). Its steps are
long (about a second), so attach reads it for `--window` seconds (30: a few hundred
samples) and the program's own share is taken from its waits' wall-clock times, cut to
the seconds attach's kept samples span; each applied configuration is timed over
`--window` seconds too (an epoch of 20 steps, its validation and checkpoint, lasts
about 20 s: a shorter window reads some rounds with an epoch's end and some without).

Targets (docs/performance.md): every share within 0.05 of the program's own; a job
whose fetch cannot be identified gets no `Passed`; every applied recommendation never
slower (0.97x or more) and within 20% of its prediction, or no figure given. Exit 1
where a row misses them.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "loops"))
from loopstate import (  # noqa: E402
    advised_workers,
    attach_beside,
    own_share,
    read_state,
    stop_tree,
)

TOLERANCE = 0.05  # a share against the program's own clock
ADVICE_TOLERANCE = 0.20  # an applied change against its prediction
ARGS = [
    "config/train_shakespeare_char.py",
    "--dataset=tiny",
    "--device=cpu",
    "--compile=False",
    "--dtype=float32",
    "--eval_iters=2",
    "--eval_interval=1000000",
    "--log_interval=1000000",
    "--block_size=64",
    "--batch_size=32",
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=32",
    "--dropout=0.0",
    "--max_iters=1000000",
    "--lr_decay_iters=1000000",
]

OWN_CLOCK = """
# --- the program's own clock (starvecheck benchmarks/real_programs.py) ---
import time as _t, json as _j
_own = os.environ["OWN_CLOCK"]
_waited, _t0, _steps = 0.0, _t.perf_counter(), 0
_get_batch = get_batch
def get_batch(split):
    global _waited
    _a = _t.perf_counter(); _r = _get_batch(split); _waited += _t.perf_counter() - _a
    return _r
_waits = open(_own + ".waits", "a", buffering=1)  # each wait, wall-clock start and end
def _own_write():
    global _steps
    _steps += 1
    with open(_own + ".tmp", "w") as _f:
        _j.dump({"waited": _waited, "total": _t.perf_counter() - _t0, "steps": _steps}, _f)
    os.replace(_own + ".tmp", _own)
"""


def prepare(checkout: Path, work: Path) -> Path:
    """A copy of the checkout with the instrumented train_timed.py and tiny data."""
    import numpy as np

    copy = work / "nanoGPT"
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git"))
    source = (copy / "train.py").read_text()
    anchor = "# init these up here, can override"
    if anchor not in source or "    iter_num += 1\n" not in source:
        raise SystemExit(f"{checkout}/train.py is not the nanoGPT this script knows")
    timed = source.replace(anchor, OWN_CLOCK + "\n" + anchor, 1)
    timed = timed.replace("    iter_num += 1\n", "    iter_num += 1\n    _own_write()\n", 1)
    (copy / "train_timed.py").write_text(timed)
    data = copy / "data" / "tiny"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", 4_000_000), ("val", 200_000)):
        rng.integers(0, 65, n, dtype=np.uint16).tofile(data / f"{name}.bin")
    meta = {"vocab_size": 65, "itos": {i: chr(40 + i) for i in range(65)}}
    meta["stoi"] = {c: i for i, c in meta["itos"].items()}
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))
    return copy


def burners(cpus: int) -> list[subprocess.Popen]:
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(cpus)]


def fetch_share(stage: dict, pid: int) -> tuple[float | None, str]:
    """The share attach gives the loop's data fetch, and its data-wait finding's title."""
    share = None
    for m in stage["metrics"]:
        lab = m["labels"]
        if (
            lab.get("pid") == pid
            and lab.get("kind") == "data"
            and lab.get("quantity") == "main_share"
        ):
            share = float(m["value"])
    title = next((f["title"] for f in stage["findings"] if f["id"] == "attach.data-wait"), "")
    return share, title


def run_once(copy: Path, work: Path, seconds: float, busy: int) -> tuple[float, float | None, str]:
    state = work / f"own-{busy}-{time.monotonic_ns()}.json"
    out = work / "out"
    cmd = [sys.executable, "train_timed.py", *ARGS, f"--out_dir={out}"]
    others = burners(busy)
    p = subprocess.Popen(cmd, cwd=copy, env={**os.environ, "OWN_CLOCK": str(state)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not state.exists():
            if p.poll() is not None or time.time() > deadline:
                raise SystemExit("nanoGPT did not start")
            time.sleep(0.2)
        time.sleep(3.0)
        attach = [sys.executable, "-m", "starvecheck", "attach", str(p.pid), "--json", "-",
                  "--duration", str(round(seconds))]  # fmt: skip
        r, (a,), (b,) = attach_beside(attach, [state], timeout=seconds + 120)
        if r.returncode not in (0, 1):
            raise SystemExit(f"attach failed: {r.stderr.strip()}")
        stage = json.loads(r.stdout)["stages"][0]
        share, title = fetch_share(stage, p.pid)
        return own_share(a, b), share, title
    finally:
        stop_tree(p)
        for o in others:
            o.kill()
            o.wait()


# --- pytorch/examples imagenet/main.py: a DataLoader job with real JPEG decode -----------

IMAGENET_OWN = """
# --- the program's own clock (starvecheck benchmarks/real_programs.py) ---
import json as _j
_own = os.environ["OWN_CLOCK"]
_W = {"waited": 0.0, "steps": 0, "train_waited": 0.0, "train_total": 0.0, "t0": time.perf_counter()}
_waits = open(_own + ".waits", "a", buffering=1)  # each wait, wall-clock start and end
_steps = open(_own + ".steps", "a", buffering=1)  # each training step's wait, seconds
def _own_write():
    _s = {"waited": _W["waited"], "total": time.perf_counter() - _W["t0"], "steps": _W["steps"],
          "train_waited": _W["train_waited"], "train_total": _W["train_total"]}
    with open(_own + ".tmp", "w") as _f:
        _j.dump(_s, _f)
    os.replace(_own + ".tmp", _own)
def _own_timed(loader, kind):
    # Starting the pass (its workers) is waiting for data too, as main.py's own Data
    # meter has it (its clock starts before enumerate()).
    a = time.perf_counter()
    it, prev = iter(loader), None
    started = time.perf_counter() - a
    _W["waited"] += started
    if kind == "train":
        _W["train_waited"] += started
        _W["train_total"] += started
    while True:
        _own_write()
        a = time.perf_counter()
        if prev is not None and kind == "train":
            _W["train_total"] += a - prev
        try:
            x = next(it)
        except StopIteration:
            break
        b = time.perf_counter()
        _waits.write(f"{time.time() - (b - a):.6f} {time.time():.6f}\\n")
        _W["waited"] += b - a
        if kind == "train":
            _W["train_waited"] += b - a
            _W["train_total"] += b - a
            _W["steps"] += 1
            _steps.write(f"{b - a + started:.6f}\\n")  # a pass's start in its first
            started = 0.0
        prev = b
        yield x
    if kind == "train" and os.environ.get("WATCH_REPORT"):
        _p = os.environ["WATCH_REPORT"]
        with open(_p + ".tmp", "w") as _f:
            _j.dump(loader.report().to_dict(), _f)
        os.replace(_p + ".tmp", _p)
def _own_watch(loader):
    if not os.environ.get("WATCH_REPORT"):
        return loader
    import starvecheck
    return starvecheck.watch(loader, show=False, stages=os.environ.get("WATCH_STAGES") != "0")
"""

IMAGENET_EDITS = [
    (
        "from torch.utils.data import Subset\n",
        "from torch.utils.data import Subset\n" + IMAGENET_OWN,
    ),
    ("enumerate(train_loader):", "enumerate(_own_timed(train_loader, 'train')):"),
    ("enumerate(loader):", "enumerate(_own_timed(loader, 'val')):"),
    (
        "    if args.evaluate:\n        validate(",
        "    train_loader = _own_watch(train_loader)\n    if args.evaluate:\n        validate(",
    ),
]

# (what the set is, its long side x short side, training images): big photos decode in
# about 80 ms each, so one worker feeding batches of 8 is the limit; small ones in
# under 2 ms, so the model's step is.
IMAGE_SETS = {"data-bound": (3200, 2400, 160), "compute-bound": (480, 360, 160)}


def make_images(root: Path, size: tuple[int, int, int]) -> Path:
    """An ImageFolder tree (2 classes, 8 validation images) of JPEGs: smooth gradients
    with noise, so that they compress and decode like photographs, not like flat colour."""
    import numpy as np
    from PIL import Image

    w, h, n = size
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w]
    for split, count in (("train", n), ("val", 8)):
        for i in range(count):
            d = root / split / f"c{i % 2}"
            d.mkdir(parents=True, exist_ok=True)
            base = np.stack([(xx * (i + 1) / w * 255) % 256, (yy * 255 / h), (xx + yy) % 256], -1)
            noise = rng.normal(0, 12, (h, w, 3))
            px = np.clip(base + noise, 0, 255).astype(np.uint8)
            Image.fromarray(px).save(d / f"{i}.jpg", quality=90)
    return root


def prepare_imagenet(checkout: Path, work: Path) -> Path:
    copy = work / "imagenet"
    copy.mkdir()
    source = (checkout / "imagenet" / "main.py").read_text()
    for old, new in IMAGENET_EDITS:
        if source.count(old) != 1:
            raise SystemExit(f"{checkout}/imagenet/main.py is not the one this script knows")
        source = source.replace(old, new)
    (copy / "main_timed.py").write_text(source)
    for name, size in IMAGE_SETS.items():
        make_images(work / "images" / name, size)
    return copy


def imagenet_cmd(work: Path, images: str, workers: int) -> list[str]:
    return [sys.executable, str(work / "imagenet" / "main_timed.py"), "-a", "mobilenet_v3_small",
            "-b", "8", "-j", str(workers), "--epochs", "100000", "-p", "100000000",
            str(work / "images" / images)]  # fmt: skip


def start_imagenet(work: Path, images: str, workers: int, state: Path,
                   report: Path | None = None) -> subprocess.Popen:  # fmt: skip
    env = {**os.environ, "OWN_CLOCK": str(state)}
    if report is not None:
        env["WATCH_REPORT"] = str(report)
    p = subprocess.Popen(imagenet_cmd(work, images, workers), cwd=work / "imagenet", env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)  # fmt: skip
    deadline = time.time() + 120
    while not state.exists():
        if p.poll() is not None or time.time() > deadline:
            stop_tree(p)
            raise SystemExit("imagenet/main.py did not start")
        time.sleep(0.2)
    return p


def waited_within(log: Path, start: float, end: float) -> float:
    """The program's own data-wait share over [start, end] (wall clock): its waits,
    each logged with its start and end once it is over, cut to the window. A wait still
    going at `end` is logged when it ends: read once one has ended after `end`."""
    deadline = time.time() + 60
    while True:
        spans = [tuple(map(float, line.split())) for line in log.read_text().splitlines()
                 if len(line.split()) == 2]  # fmt: skip
        if (spans and spans[-1][1] >= end) or time.time() > deadline:
            break
        time.sleep(0.2)
    inside = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
    return inside / (end - start)


def imagenet_attach(work: Path, images: str, seconds: float) -> dict:
    state = work / f"own-attach-{time.monotonic_ns()}.json"
    p = start_imagenet(work, images, 1, state)
    try:
        time.sleep(4.0)
        attach = [sys.executable, "-m", "starvecheck", "attach", str(p.pid), "--json", "-",
                  "--duration", str(round(seconds))]  # fmt: skip
        window: list[float] = []
        r, _, _ = attach_beside(attach, [state], timeout=seconds + 120, window=window)
        if r.returncode not in (0, 1):
            raise SystemExit(f"attach failed: {r.stderr.strip()}")
        stage = json.loads(r.stdout)["stages"][0]
        share, title = fetch_share(stage, p.pid)
        own = waited_within(Path(str(state) + ".waits"), window[0], window[1])
        k, gain, said = advised_workers(stage["findings"], ("attach.loader-bound",))
        if share is None:  # no share read: what attach said instead
            said = "; ".join(f"{f['id']}: {f['title']}" for f in stage["findings"])
        return {"own": own, "seen": share, "title": title, "k": k, "gain": gain,
                "said": said}  # fmt: skip
    finally:
        stop_tree(p)


def watch_metric(report: dict, quantity: str) -> float:
    for m in report["stages"][0]["metrics"]:
        if m["labels"].get("quantity") == quantity:
            return float(m["value"])
    return 0.0


def imagenet_watch(work: Path, images: str, epochs: int) -> dict:
    state = work / f"own-watch-{time.monotonic_ns()}.json"
    report = work / f"watch-{time.monotonic_ns()}.json"
    p = start_imagenet(work, images, 1, state, report)
    try:
        deadline = time.time() + 300
        got = None
        while time.time() < deadline:
            try:
                got = json.loads(report.read_text())
            except (OSError, ValueError):
                got = None
            if (
                got is not None
                and watch_metric(got, "steps") >= epochs * IMAGE_SETS[images][2] // 8 - epochs
            ):
                break
            time.sleep(0.5)
        own = read_state(state)
    finally:
        stop_tree(p)
    if got is None:
        raise SystemExit("watch wrote no report")
    seen = watch_metric(got, "data_wait_share")
    findings = [f for s in got["stages"] for f in s["findings"]] + got.get("checklist", [])
    k, gain, said = advised_workers(findings, tuple({f["id"] for f in findings}))
    return {"own": own["train_waited"] / own["train_total"], "seen": seen, "title": said,
            "k": k, "gain": gain, "said": said}  # fmt: skip


def imagenet_rate(work: Path, images: str, workers: int, seconds: float) -> float:
    """Training steps a second (the program's own count, over wall time: its validation
    and checkpoints included), after 4 s of warm-up."""
    state = work / f"own-rate-{time.monotonic_ns()}.json"
    p = start_imagenet(work, images, workers, state)
    try:
        time.sleep(4.0)
        a = read_state(state)
        time.sleep(seconds)
        b = read_state(state)
    finally:
        stop_tree(p)
    return (b["steps"] - a["steps"]) / (b["total"] - a["total"])


def applied(work: Path, images: str, k: int, rounds: int, seconds: float) -> list[float]:
    """k workers against the program's 1, in interleaved rounds (each the other order)."""
    ratios = []
    for r in range(rounds):
        pair = [1, k] if r % 2 == 0 else [k, 1]
        got = {n: imagenet_rate(work, images, n, seconds) for n in pair}
        ratios.append(got[k] / got[1])
    return ratios


def run_imagenet(checkout: Path, work: Path, a: argparse.Namespace) -> int:
    prepare_imagenet(checkout, work)
    missed = 0
    for images in IMAGE_SETS:
        for busy in a.loads:
            others = burners(busy)
            try:
                time.sleep(1.0)
                for tool in ("attach", "watch"):
                    got = (imagenet_attach(work, images, a.window) if tool == "attach"
                           else imagenet_watch(work, images, a.epochs))  # fmt: skip
                    diff = None if got["seen"] is None else got["seen"] - got["own"]
                    ok = diff is not None and abs(diff) <= TOLERANCE
                    line = (f"| imagenet/main.py {images} -j 1 | {busy} CPU(s) | {tool} | "
                            f"{got['own']:.3f} | "
                            f"{'none' if got['seen'] is None else format(got['seen'], '.3f')} | "
                            f"{'-' if diff is None else format(diff, '+.3f')} | ")  # fmt: skip
                    k, gain = got["k"], got["gain"]
                    if k is None or k == 1:
                        line += f"{got['said']} | - | - |"
                    else:
                        ratios = applied(work, images, k, a.rounds, a.window)
                        m = statistics.median(ratios)
                        within = m >= 0.97 and (
                            gain is None or abs(gain / m - 1) <= ADVICE_TOLERANCE
                        )
                        ok = ok and within
                        pred = "no figure" if gain is None else f"{gain:.2f}x"
                        line += (f"num_workers={k}: {pred} | {m:.2f}x ({min(ratios):.2f}-"
                                 f"{max(ratios):.2f}, {len(ratios)} rounds) | "
                                 f"{'ok' if within else 'MISSED'} |")  # fmt: skip
                    missed += not ok
                    print(line, flush=True)
            finally:
                for o in others:
                    o.kill()
                    o.wait()
    return missed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", type=Path, help="a checkout of karpathy/nanoGPT")
    ap.add_argument("--imagenet", type=Path, help="a checkout of pytorch/examples")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=30.0, help="attach's --duration (imagenet)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--loads", type=int, nargs="*", default=[0, 1, 2])
    a = ap.parse_args()
    if not a.nanogpt and not a.imagenet:
        ap.error("give --nanogpt DIR, --imagenet DIR or both")
    missed = 0
    with tempfile.TemporaryDirectory(prefix="real-programs-") as d:
        work = Path(d)
        if a.nanogpt:
            print("| program | other load | own clock | attach | difference | attach says |")
            print("|---|---|---|---|---|---|")
            copy = prepare(a.nanogpt.resolve(), work)
            for busy in a.loads:
                for _ in range(a.repeats):
                    own, seen, title = run_once(copy, work, a.seconds, busy)
                    diff = None if seen is None else seen - own
                    ok = diff is not None and abs(diff) <= TOLERANCE
                    missed += not ok
                    shown = "none" if seen is None else f"{seen:.3f}"
                    gap = "-" if diff is None else f"{diff:+.3f}"
                    print(f"| nanoGPT train.py | {busy} CPU(s) | {own:.3f} | {shown} | {gap} | "
                          f"{title} |", flush=True)  # fmt: skip
        if a.imagenet:
            print(
                "| program | other load | read by | own clock | starvecheck | difference | "
                "advice (predicted) | applied, measured | |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            missed += run_imagenet(a.imagenet.resolve(), work, a)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
