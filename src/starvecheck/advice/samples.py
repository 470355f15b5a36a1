"""The right data, not only fast data, judged for `loader --factory`: workers that
deliver the same samples (`loader.repeats`: an IterableDataset that does not split its
stream between workers), and workers that deliver nothing or far less than the others
(`loader.idle-workers`: fewer shards than workers).

Both rest on what the run read: a digest of every sample (inputs/fingerprints.py) and
the batches each worker handed over. Repeats count against the same pipeline with the
fewest workers, so a dataset that holds real duplicates is not blamed on workers, and
only for an IterableDataset: a map-style dataset's sampler hands each index to one
worker, so workers cannot repeat its samples.
"""

from __future__ import annotations

from starvecheck.advice.configurations import Point, base_repeats, describe, repeats_grow
from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Severity, StageResult
from starvecheck.core.schema.factory import Parameters as FactoryParameters

# A worker that delivered less than this share of the busiest worker's batches, once
# that one delivered at least IDLE_LEAST, gives the loader (almost) nothing.
IDLE_SHARE = 0.25
IDLE_LEAST = 8

SPLIT = (
    "Split the stream between workers in `__iter__`: "
    "`info = torch.utils.data.get_worker_info()`, then yield only every "
    "`info.num_workers`-th line from `info.id` on (`itertools.islice(lines, info.id, None, "
    "info.num_workers)`), or give each worker its own files "
    "(`files[info.id::info.num_workers]`); with DDP, split by rank too "
    "(`rank * num_workers + info.id` of `world_size * num_workers`)."
)


def rules(loader: StageResult, found: list[Point]) -> list[Finding]:
    out = [_repeats(loader, found), _idle(loader, found)]
    return [f for f in out if f is not None]


def _repeats(loader: StageResult, found: list[Point]) -> Finding | None:
    grown = repeats_grow(found) if loader.parameters.read(FactoryParameters).iterable else []
    if not grown:
        return None
    base = base_repeats(found)
    assert base is not None
    fewest, base_share = base
    p, share = max(grown, key=lambda t: t[1])
    current = next((q for q, _ in grown if q.current), None)
    raw = p.rate / max(1e-9, 1.0 - share)  # p's rates count unique samples
    evidence = (
        f"{describe(p)}: {share:.0%} of the samples it delivered had already come in the "
        f"same epoch (num_workers={fewest}: {base_share:.0%}); {raw:,.0f} samples/s "
        f"delivered, {p.rate:,.0f} of them unique"
    )
    others = [f"num_workers={q.workers}: {s:.0%}" for q, s in grown if q is not p]
    if others:
        evidence += "; " + ", ".join(others)
    cause = "each worker runs the dataset's `__iter__` over the whole stream"
    title = (
        f"With workers your pipeline delivers the same samples again: {cause}"
        if current is None
        else f"Your current settings deliver the same samples again: {cause}"
    )
    return Finding(
        catalogue.LOADER_REPEATS,
        Severity.CRITICAL if current is not None else Severity.WARNING,
        title,
        evidence=evidence + " (a digest of each sample's bytes, shape and dtype)",
        recommendation=(
            SPLIT + " Every samples/s and gain in this report counts unique samples only."
        ),
    )


def _idle(loader: StageResult, found: list[Point]) -> Finding | None:
    """Workers that gave the loader (almost) nothing, at the configuration with the most
    workers where any did."""
    worst: tuple[Point, list[float], list[int]] | None = None
    for p in sorted(found, key=lambda q: q.workers):
        counts = _worker_batches(p)
        if len(counts) < 2 or max(counts) < IDLE_LEAST:
            continue
        idle = [i for i, c in enumerate(counts) if c < IDLE_SHARE * max(counts)]
        if idle:
            worst = (p, counts, idle)
    if worst is None:
        return None
    p, counts, idle = worst
    busy = len(counts) - len(idle)
    per = ", ".join(f"worker {i}: {c:,.0f}" for i, c in enumerate(counts))
    shards = loader.parameters.read(FactoryParameters).shards
    said = f"; the dataset says it has {shards} shard(s)" if shards is not None else ""
    return Finding(
        catalogue.LOADER_IDLE_WORKERS,
        Severity.WARNING,
        f"{len(idle)} of {len(counts)} workers deliver (almost) nothing: the dataset gives "
        f"{busy} worker(s) data",
        evidence=f"{describe(p)}, batches delivered: {per}{said}",
        recommendation=(
            f"The dataset splits its data into fewer shards (files, splits) than workers, "
            f"or splits by worker so that some get none. Give it at least "
            f"num_workers x ranks shards (with Hugging Face datasets, `to_iterable_dataset"
            f"(num_shards=...)`; with WebDataset, more tar files than workers), or use "
            f"num_workers={busy}: the others only take memory."
        ),
    )


def _worker_batches(p: Point) -> list[float]:
    got = p.figures.worker_batches
    return list(got.values) if got is not None else []
