"""`watch(..., barrier=True)`: each rank waits for the others once its batch is in
hand, and the time it waits is measured; never for longer than `barrier_timeout`.

The barrier runs on a process group of its own, made with gloo whatever the job's
backend, with the timeout as the group's: gloo ends a barrier that outlives it with an
error, which an NCCL barrier does not (it waits for NCCL's timeout, ten minutes, and
then the watchdog takes the process down), and `dist.barrier` on the default group
takes no timeout at all. Its own group also keeps a barrier that timed out away from
the job's collectives: one left pending on the default group would be matched with the
next collective of the rank that never came (its gradients' all-reduce).

A rank that stopped iterating early (a `break`, an uneven last batch) or that died
never comes to the barrier: the others wait `barrier_timeout` seconds (or less, where
its connection closed), then go on without the barrier for the rest of the run, and
the report says so (`watch.barrier-timeout`). The rank waits are then estimated, as
without a barrier.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.metric import Caveat

DEFAULT_TIMEOUT_S = 60.0


class Barrier:
    """A barrier over every rank of the default group, bounded by `timeout_s`."""

    def __init__(self, group: Any, timeout_s: float, rank: int) -> None:
        self.group = group
        self.timeout_s = timeout_s
        self.rank = rank
        self.gave_up: Caveat | None = None  # why it is no longer used, once it is not

    @classmethod
    def make(cls, timeout_s: float, rank: int) -> Barrier:
        """The barrier's own gloo group; making it is a collective of every rank too,
        bounded by the same timeout. A barrier that could not be made gave up already."""
        import torch.distributed as dist

        made = cls(None, timeout_s, rank)
        try:
            made.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        except Exception as e:
            made.give_up("as it was set up", e)
        return made

    def __bool__(self) -> bool:
        return self.gave_up is None

    def wait(self, step: int) -> None:
        """Wait for every rank to come here (the batch of `step` in hand), up to the
        timeout; past it, or when a rank has gone, give up for the rest of the run."""
        if self.gave_up is not None:
            return
        import torch.distributed as dist

        started = clocks.monotonic()
        try:
            dist.barrier(group=self.group)
        except Exception as e:
            self.give_up(f"at step {step} after {clocks.monotonic() - started:.1f} s", e)

    def give_up(self, where: str, e: BaseException) -> None:
        why = " ".join(str(e).split())
        why = why if len(why) <= 160 else why[:157] + "..."
        self.gave_up = Caveat(
            "watch.barrier-timeout",
            f"barrier=True: rank {self.rank} gave up its barrier {where} (barrier_timeout "
            f"{self.timeout_s:g} s; {type(e).__name__}: {why}): a rank stopped iterating "
            "early, died or stalled; no barrier from there on, and the time ranks wait for "
            "each other is estimated",
        )
