"""What the sample digest costs `loader --factory` (inputs/fingerprints.py; issue 48,
item 5): under 2% of the slowest example pipeline's batch time.

    python benchmarks/digest_cost.py [--batches 20] [--pipelines vision,audio,text,shards]

For each example pipeline of benchmarks/pipelines/ (its data made on first use), at
num_workers=0: `--batches` batches read and each timed (what the pipeline takes to make
it), then the same batches handed to what `loader --factory` computes between batches
(owndata.batch_figures and fingerprints.Repeats.add, as configuration.py calls them),
each timed, three times, the least taken. Then one case made to be costly: batches of 8
numpy object rows of 1 MiB strings (issue 48: the digest repr()'d each row whole, 2.56 s a
batch against 0.64 s to make it).

Prints a Markdown table: per pipeline, the median batch time, the median digest time
and their ratio; the bar is the largest digest time against 2% of the slowest
pipeline's median batch time, and each pipeline's own ratio is shown beside it. Exit
status 1 when the bar is missed. With num_workers=0 the digest's time is also taken out
of the measured window (configuration.py, `_own`); this is its cost, not its effect.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from starvecheck.inputs.fingerprints import Repeats
from starvecheck.stages.loader.factory.owndata import batch_figures

HERE = Path(__file__).resolve().parent
BAR = 0.02  # of the slowest pipeline's batch time

PIPELINES = {
    "vision": ("vision", "imagefolder"),
    "audio": ("audio", "mel"),
    "text": ("text", "tokenized"),
    "shards": ("shards", "dataloader"),
}


def _factory(name: str) -> Any:
    sys.path.insert(0, str(HERE / "pipelines"))
    module, func = PIPELINES[name]
    return getattr(__import__(module), func)()


def read(loader: Any, batches: int) -> tuple[list[Any], list[float]]:
    """`batches` batches of `loader` and each one's time."""
    out, times = [], []
    it = iter(loader)
    next(it)  # the first: the loader's start, not a batch's time
    for _ in range(batches):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        times.append(time.perf_counter() - t0)
        out.append(batch)
    return out, times


def digest_times(batches: list[Any], batch_size: int | None) -> list[float]:
    """Each batch's figures and digest, as configuration.py computes them; the least of
    three passes (a fresh Repeats each: every digest is computed)."""
    best = [float("inf")] * len(batches)
    for _ in range(3):
        repeats = Repeats()
        for i, batch in enumerate(batches):
            t0 = time.perf_counter()
            n, _ = batch_figures(batch, batch_size)
            repeats.add(batch, n)
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def huge_strings(batches: int) -> tuple[list[Any], list[float]]:
    import numpy as np

    out, times = [], []
    for b in range(batches):
        t0 = time.perf_counter()
        a = np.empty((8, 1), dtype=object)
        for i in range(8):
            a[i, 0] = chr(65 + (b + i) % 26) * (1 << 20)
        times.append(time.perf_counter() - t0)
        out.append(a)
    return out, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    args = parser.parse_args()
    rows = []
    for name in args.pipelines.split(","):
        loader = _factory(name)
        batches, made = read(loader, args.batches)
        cost = digest_times(batches, getattr(loader, "batch_size", None))
        rows.append((name, statistics.median(made), statistics.median(cost), max(cost)))
    batches, made = huge_strings(max(4, args.batches // 4))
    cost = digest_times(batches, 8)
    odd = (
        "object rows, 1 MiB strings",
        statistics.median(made),
        statistics.median(cost),
        max(cost),
    )
    print("| pipeline | batch (median) | digest (median) | digest (max) | share |")
    print("| --- | --- | --- | --- | --- |")
    for name, m, c, top in [*rows, odd]:
        print(
            f"| {name} | {m * 1e3:.2f} ms | {c * 1e3:.3f} ms | {top * 1e3:.3f} ms | {c / m:.2%} |"
        )
    slowest = max(m for _, m, _, _ in rows)
    worst = max(top for _, _, _, top in rows)
    ok = worst <= BAR * slowest
    print(
        f"\nlargest digest {worst * 1e3:.3f} ms against {BAR:.0%} of the slowest pipeline's "
        f"batch time ({slowest * 1e3:.1f} ms): {worst / slowest:.2%}, "
        f"{'within' if ok else 'OVER'} the bar"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
