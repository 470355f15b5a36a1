"""The right data in a watched loop (`starvecheck.watch`): ranks that train on the same
batches, and a shuffling sampler that deals the same order every epoch.

Both rest on the digests of each pass's first samples (loop/samples.py): rank 0
compares the ranks' of the same pass, each rank its last two passes.
"""

from __future__ import annotations

from starvecheck.advice.results import Results
from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Severity, StageResult
from starvecheck.core.schema.steps import Parameters as StepParameters

# Of the first samples compared, this share on every rank: the ranks read the same data.
SAME_SHARE = 0.9
LEAST_COMPARED = 8


def rules(results: Results) -> list[Finding]:
    r = results.get("watch")
    if r is None:
        return []
    out = [_same_batches(r), _set_epoch(r)]
    return [f for f in out if f is not None]


def _same_batches(r: StageResult) -> Finding | None:
    p = r.parameters.read(StepParameters)
    share, compared = p.ranks_same_share, p.ranks_samples_compared
    if share is None or compared is None or compared < LEAST_COMPARED or share < SAME_SHARE:
        return None
    world = p.world_size or 2
    sampler = p.sampler or "not a DataLoader's"
    return Finding(
        catalogue.WATCH_RANKS_SAME_BATCHES,
        Severity.CRITICAL,
        f"Every rank trains on the same samples: {world} ranks, one rank's worth of data",
        evidence=(
            f"of the first {compared:,} samples of the pass every rank digested, {share:.0%} "
            f"were on all {world} ranks (a digest of each sample's bytes, shape and dtype); "
            f"the DataLoader's sampler: {sampler}"
        ),
        recommendation=(
            "Give each rank its own share of the data: "
            "`sampler = DistributedSampler(dataset, shuffle=True)` and "
            "`DataLoader(dataset, sampler=sampler, ...)` (no `shuffle=` beside it), with "
            "`sampler.set_epoch(epoch)` at each epoch's start; Lightning and the Hugging "
            "Face Trainer add one themselves unless told not to "
            "(`use_distributed_sampler=False`, a DataLoader built by hand). An "
            "IterableDataset splits by `torch.distributed.get_rank()` itself."
        ),
    )


def _set_epoch(r: StageResult) -> Finding | None:
    p = r.parameters.read(StepParameters)
    shuffles = p.sampler_shuffle or p.sampler == "RandomSampler"
    if not shuffles or not p.same_order_passes:
        return None
    epochs = p.sampler_epochs
    kept = len(epochs) >= 2 and len(set(epochs)) == 1
    said = f"; its epoch stayed {epochs[-1]}" if kept else ""
    fix = (
        "Call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating: "
        "DistributedSampler seeds its shuffle with seed + epoch, so without it every "
        "epoch deals the same order."
        if p.sampler_shuffle
        else "A sampler made again each epoch with one seed deals the same order: seed it "
        "with the epoch (`torch.Generator().manual_seed(seed + epoch)`), or make the "
        "DataLoader once."
    )
    return Finding(
        catalogue.WATCH_SET_EPOCH,
        Severity.WARNING,
        f"Your shuffling sampler ({p.sampler}) deals the same order every epoch",
        evidence=(
            f"the last two passes began with the same samples in the same order (a digest "
            f"of each of their first samples){said}"
        ),
        recommendation=fix,
    )
