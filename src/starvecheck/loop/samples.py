"""What a watched loop's first batches of each pass say: their size in bytes (what a
worker would hand over), a digest of each of their samples (inputs/fingerprints.py),
and the sampler's epoch when the pass began.

Under torch.distributed rank 0 compares the ranks' digests of the same pass (ranks
that train on the same batches: no DistributedSampler, or a shuffle with one seed on
every rank), and each rank compares its last two passes (a shuffling
DistributedSampler whose `set_epoch` is never called deals the same order every
epoch). Reading them is the loop's first DIGESTED batches a pass, timed as neither
wait nor compute; after them a step costs nothing more.
"""

from __future__ import annotations

from typing import Any

from starvecheck.inputs.fingerprints import digests, leading
from starvecheck.loading.stamps import batch_nbytes
from starvecheck.loop.times import LoopTimes

SIZED = 3  # the first batches whose bytes are read
DIGESTED = 4  # the first batches of each pass whose samples are digested
MAX_SAMPLES = 1024  # digests kept a pass, at most
READ = max(SIZED, DIGESTED)  # the first batches of each pass read at all


class FirstBatches:
    """The first batches of one pass, read into `times`."""

    def __init__(self, times: LoopTimes, iterable: Any) -> None:
        self.times = times
        self.left = READ  # batches still to read: the loop tests this
        self.digests: list[int] = []
        times.digests[times.passes] = self.digests
        for old in sorted(times.digests)[:-2]:  # the last two passes are compared
            del times.digests[old]
        _sampler(times, iterable)

    def read(self, item: Any) -> None:
        """One batch as the loop got it; never raises (the user's objects may)."""
        self.left -= 1
        seen = READ - self.left  # this batch's place among the pass's first
        t = self.times
        if seen <= SIZED:
            sized(t, item)
        try:
            if seen <= DIGESTED and len(self.digests) < MAX_SAMPLES:
                size = leading(item)
                t.batch_samples = t.batch_samples or size or None
                got = digests(item, size)
                if got is None:
                    t.digest_gaps += 1
                else:
                    self.digests.extend(got[: MAX_SAMPLES - len(self.digests)])
        except Exception:
            t.digest_gaps += 1


def sized(times: LoopTimes, item: Any) -> None:
    """A batch's bytes of arrays into `times.batch_bytes`, the largest read; never
    raises (an `nbytes` property of the user's may)."""
    try:
        nbytes = batch_nbytes(item)
    except Exception:
        nbytes = 0
    times.batch_bytes = max(times.batch_bytes or 0, nbytes)


def _sampler(times: LoopTimes, iterable: Any) -> None:
    """The loop's sampler when it is a DataLoader's: its class, whether it shuffles,
    and (a DistributedSampler's) the epoch it was set to when this pass began."""
    try:
        sampler = getattr(iterable, "sampler", None)
        if sampler is None:
            return
        times.sampler = type(sampler).__name__
        shuffle = getattr(sampler, "shuffle", None)
        times.sampler_shuffle = shuffle if isinstance(shuffle, bool) else None
        epoch = getattr(sampler, "epoch", None)
        if hasattr(sampler, "set_epoch") and isinstance(epoch, int):
            times.sampler_epochs.append(epoch)
    except Exception:  # a property of the user's that raises: nothing read
        return


def shared(per_rank: dict[int, list[int]]) -> tuple[float, int] | None:
    """Of the first samples every rank digested in the same pass, the share that every
    rank had, and how many were compared; None where fewer than two ranks sent any."""
    sets = [set(d) for d in per_rank.values() if d]
    if len(sets) < 2:
        return None
    smallest = min(sets, key=len)
    common = set.intersection(*sets)
    return len(common) / len(smallest), len(smallest)
