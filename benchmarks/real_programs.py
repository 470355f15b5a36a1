"""`attach` on a training program nobody here wrote (issue 46, item 7): nanoGPT's
train.py, unmodified, fetching its batches with its own memmap `get_batch` (no
DataLoader). The share attach reports for that fetch is set against the program's own
clock over the same seconds: an instrumented copy (made here, in a temporary directory,
from the checkout given) adds up the seconds spent in `get_batch` and writes its totals
after every iteration. Quiet, and with other processes taking one and two CPUs.

    python benchmarks/real_programs.py --nanogpt DIR [--seconds 10] [--repeats 2]

DIR is a checkout of https://github.com/karpathy/nanoGPT (MIT); nothing of it is kept
in this repository. Its data is made here: random uint16 tokens (4M train, 200k val) in
the layout its `prepare.py` leaves. The model is sized so that fetching is a real part
of each step on a CPU (1 layer, 32 wide, batches of 32 x 64 tokens).

Target (docs/performance.md): every share within 0.05 of the program's own; a job whose
fetch cannot be identified gets no `Passed`.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "loops"))
from loopstate import attach_beside, own_share, stop_tree  # noqa: E402

TOLERANCE = 0.05
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    missed = 0
    print("| program | other load | own clock | attach | difference | attach says |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="real-programs-") as d:
        work = Path(d)
        copy = prepare(a.nanogpt.resolve(), work)
        for busy in (0, 1, 2):
            for _ in range(a.repeats):
                own, seen, title = run_once(copy, work, a.seconds, busy)
                diff = None if seen is None else seen - own
                ok = diff is not None and abs(diff) <= TOLERANCE
                missed += not ok
                shown = "none" if seen is None else f"{seen:.3f}"
                gap = "-" if diff is None else f"{diff:+.3f}"
                print(f"| nanoGPT train.py | {busy} CPU(s) | {own:.3f} | {shown} | {gap} | "
                      f"{title} |", flush=True)  # fmt: skip
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
