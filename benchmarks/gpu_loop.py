"""watch's CUDA-event clock, attach and the Lightning callback on a real CUDA training
loop: the GPU figures that tests can only drive on a fake device clock.

    python benchmarks/gpu_loop.py OUT_DIR [--only NAME ...]

Parts (each writes NAME.json to OUT_DIR and a line to the table printed last):
  events     a loop whose fetch (sleeps, num_workers=0) outlasts its GPU step, and one
             whose GPU step outlasts its fetch: watch's `gpu_idle_data_wait_share`
             beside the idle share of the GPU's own kernel timeline, read from a
             torch.profiler trace of the same steps (written to OUT_DIR/trace, then read
             by `starvecheck profile --trace`). Target: within 0.02 of the step.
  overhead   a 25 ms GPU step, batches at once: steps/s with watch (events on) and
             without, interleaved rounds; asynchronous (nothing waits for the GPU) and
             synchronous (loss.item() every step). Target: under 0.5%.
  headspace  the data-bound loop with headspace=20: the step timed without the data
             wait against the GPU step timed alone.
  attach     `starvecheck attach PID` on the data-bound loop run as its own process,
             beside that loop's own clock (tests/loops/loopstate.py), with its GPU read
             through NVML.
  lightning  a tiny LightningModule on the GPU with LightningCallback(gpu_events=True).

Without CUDA the GPU step runs on the CPU and the GPU figures are absent: the script
runs here too, to check itself before a lent GPU's minutes are spent on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "loops"))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import starvecheck  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROWS: list[str] = []


class Fetch(Dataset):
    """A sample that takes `ms` to arrive (sleeping: slow storage, no CPU)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.ms:
            time.sleep(self.ms / 1000)
        return torch.ones(1024)


class Step:
    """A GPU step of about `ms`: a chain of matrix products, queued, never waited for
    (unless `sync`: loss.item(), as a loop that logs its loss every step)."""

    def __init__(self, ms: float) -> None:
        n = 4096 if DEV == "cuda" else 256
        g = torch.Generator(device="cpu").manual_seed(0)
        self.a = torch.randn(n, n, generator=g).to(DEV)
        self.w = (torch.randn(n, n, generator=g) / n**0.5).to(DEV)
        self.k = 1
        one = self.time(4) / 4
        self.k = max(1, round(ms / one))
        self.ms = self.time(3) / 3

    def __call__(self, batch: torch.Tensor, sync: bool = False) -> None:
        y = self.a
        for _ in range(self.k):
            y = y @ self.w
        loss = y[0, 0] + batch.to(DEV, non_blocking=True).sum()
        if sync:
            loss.item()

    def time(self, n: int) -> float:
        x = torch.ones(8, 1024)
        self(x)
        if DEV == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            self(x)
        if DEV == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1000


def loader(sample_ms: float, batch: int = 8) -> DataLoader:
    return DataLoader(Fetch(sample_ms), batch_size=batch, num_workers=0)


def metric(report: dict, name: str) -> float | None:
    for stage in report.get("stages", []):
        for m in stage.get("metrics", []):
            if m["name"] == name:
                return m["value"] if "value" in m else m.get("median")
    return None


def trace_idle(folder: Path) -> tuple[float, int]:
    """The GPU's idle share between its first and last kernel in a torch.profiler
    trace, and how many device events it was read from."""
    busy: list[tuple[float, float]] = []
    for f in folder.glob("*.json"):
        for e in json.loads(f.read_text()).get("traceEvents", []):
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e:
                busy.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    if not busy:
        return float("nan"), 0
    busy.sort()
    covered, end = 0.0, busy[0][0]
    for a, b in busy:
        if b > end:
            covered += b - max(a, end)
            end = b
    span = end - busy[0][0]
    return 1 - covered / span, len(busy)


def events(out: Path) -> None:
    """watch's events against the profiler's kernel timeline, data-bound and GPU-bound."""
    from torch.profiler import ProfilerActivity, profile

    step = Step(20)
    for name, sample_ms in (("data-bound", 4.0), ("gpu-bound", 1.0)):
        folder = out / f"trace-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
        with open(out / f"events-{name}.txt", "w") as log:
            w = starvecheck.watch(loader(sample_ms), file=log, show=False, gpu_events=None)
            it = iter(w)
            for _ in range(5):  # warm-up, outside the trace and counted by watch too
                step(next(it))
            with profile(activities=acts) as prof:
                for batch in islice(it, 60):
                    step(batch)
                if DEV == "cuda":
                    torch.cuda.synchronize()
            prof.export_chrome_trace(str(folder / "rank0.pt.trace.json"))
            report = w.report().to_dict()
        (out / f"events-{name}.json").write_text(json.dumps(report))
        share = metric(report, "gpu_idle_data_wait_share")
        host = metric(report, "data_wait_share")
        idle, n = trace_idle(folder)
        fmt = "n/a" if share is None else f"{share:.3f}"
        ROWS.append(f"events {name}: GPU step {step.ms:.1f} ms, fetch {8 * sample_ms:.0f} ms; "
                    f"watch gpu idle {fmt}, host wait {host}, trace idle {idle:.3f} "
                    f"({n} device events)")  # fmt: skip
        cmd = [sys.executable, "-m", "starvecheck", "profile", "--trace", str(folder),
               "--json", str(out / f"profile-{name}.json")]  # fmt: skip
        run(cmd, out / f"profile-{name}.txt", 120)


def overhead(out: Path, rounds: int = 9, steps: int = 40) -> None:
    """Steps/s with watch (CUDA events on, and off) over plain, interleaved rounds; then
    where a synchronous loop's watched step spends its host time (cProfile)."""
    step = Step(25)
    hows = {"plain": None, "no-events": False, "watch": None}
    res: dict[str, dict[str, list[float]]] = {}
    for sync in (False, True):
        mode = "sync" if sync else "async"
        res[mode] = {how: [] for how in hows}
        for r in range(rounds):
            order = list(hows) if r % 2 == 0 else list(reversed(hows))
            for how in order:
                ld = loader(0.0)
                it = iter(ld if how == "plain" else
                          starvecheck.watch(ld, show=False, gpu_events=hows[how]))  # fmt: skip
                step(next(it), sync)
                if DEV == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                for batch in islice(it, steps):
                    step(batch, sync)
                if DEV == "cuda":
                    torch.cuda.synchronize()
                res[mode][how].append(steps / (time.perf_counter() - t))
        for how in ("no-events", "watch"):
            ratios = [w / p for w, p in zip(res[mode][how], res[mode]["plain"], strict=True)]
            ROWS.append(f"overhead {mode} {how}: step {step.ms:.1f} ms, over plain steps/s "
                        f"median {statistics.median(ratios):.4f} ({min(ratios):.4f}-"
                        f"{max(ratios):.4f}, {rounds} rounds)")  # fmt: skip
    (out / "overhead.json").write_text(json.dumps(res))
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    it = iter(starvecheck.watch(loader(0.0), show=False))
    prof.enable()
    for batch in islice(it, 200):
        step(batch, True)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    (out / "overhead-profile.txt").write_text(text.getvalue())


def headspace(out: Path) -> None:
    step = Step(20)
    with open(out / "headspace.txt", "w") as log:
        w = starvecheck.watch(loader(4.0), file=log, show=True, headspace=20)
        for batch in islice(w, 60):
            step(batch)
        if DEV == "cuda":
            torch.cuda.synchronize()
        report = w.report().to_dict()
    (out / "headspace.json").write_text(json.dumps(report))
    found = [f"{f['id']}: {f['title']}" for f in report.get("checklist", [])]
    ROWS.append(f"headspace: GPU step alone {step.ms:.1f} ms; findings: {found}")


def child(state: str, seconds: float) -> None:
    """The data-bound loop as a process of its own, writing its own clock each step."""
    from loopstate import write_state

    step = Step(20)
    waited = 0.0
    start = time.perf_counter()
    it = iter(loader(4.0))
    for n in range(1, 1_000_000):
        t = time.perf_counter()
        batch = next(it)
        waited += time.perf_counter() - t
        step(batch)
        write_state(state, waited, time.perf_counter() - start, n)
        if time.perf_counter() - start > seconds:
            break


def attach(out: Path) -> None:
    from loopstate import attach_beside, data_share, own_share, stop_tree

    state = out / "attach-state.json"
    p = subprocess.Popen([sys.executable, __file__, "--child", str(state), "60"],
                         start_new_session=True)  # fmt: skip
    try:
        while not state.exists():
            time.sleep(0.1)
        time.sleep(3)
        cmd = [sys.executable, "-m", "starvecheck", "attach", str(p.pid), "--duration", "10",
               "--json", str(out / "attach.json")]  # fmt: skip
        done, before, after = attach_beside(cmd, [state], timeout=120)
        (out / "attach.txt").write_text(done.stdout + done.stderr)
        own = own_share(before[0], after[0])
        rep = json.loads((out / "attach.json").read_text())
        shares = [data_share(s, p.pid) for s in rep["stages"] if s.get("stage") == "attach"]
        gpu = [m for s in rep["stages"] for m in s["metrics"] if "gpu" in m["name"]]
        ROWS.append(f"attach: exit {done.returncode}, share {shares} vs own {own:.3f}; "
                    f"GPU metrics {[(m['name'], m.get('value')) for m in gpu][:4]}")  # fmt: skip
    finally:
        stop_tree(p)


def lightning(out: Path) -> None:
    try:
        import lightning as L
    except ImportError as e:
        ROWS.append(f"lightning: not run ({e})")
        return
    from starvecheck.integrations import LightningCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                           torch.nn.Linear(4096, 1024))  # fmt: skip

        def training_step(self, batch: torch.Tensor, i: int) -> torch.Tensor:
            y = batch
            for _ in range(20):
                y = self.net(y)
            return y.square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    cb = LightningCallback(gpu_events=True, show=False)
    ds = torch.utils.data.Subset(Fetch(3.0), range(8 * 60))
    trainer = L.Trainer(max_epochs=1, accelerator="auto", devices=1, callbacks=[cb],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(Tiny(), DataLoader(ds, batch_size=8, num_workers=0))
    report = cb.watch.report().to_dict()
    (out / "lightning.json").write_text(json.dumps(report))
    ROWS.append(f"lightning: steps {metric(report, 'steps')}, host wait "
                f"{metric(report, 'data_wait_share')}, gpu idle "
                f"{metric(report, 'gpu_idle_data_wait_share')}")  # fmt: skip


def run(cmd: list[str], log: Path, limit: float) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        log.write_text(done.stdout + done.stderr + f"\n[exit {done.returncode}]\n")
    except subprocess.TimeoutExpired:
        log.write_text(f"timed out after {limit} s\n")


PARTS = {"events": events, "overhead": overhead, "headspace": headspace, "attach": attach,
         "lightning": lightning}  # fmt: skip


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], float(sys.argv[3]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="*", choices=sorted(PARTS))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"device {DEV}: {torch.cuda.get_device_name() if DEV == 'cuda' else 'no CUDA'}")
    for name in a.only or PARTS:
        t = time.perf_counter()
        try:
            PARTS[name](a.out)
        except Exception as e:  # one part's failure is a row, not the end of the run
            ROWS.append(f"{name}: FAILED {type(e).__name__}: {e}")
        print(f"{name} done in {time.perf_counter() - t:.0f} s", flush=True)
    print("\n".join(ROWS))
    (a.out / "table.txt").write_text("\n".join(ROWS) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    main()
