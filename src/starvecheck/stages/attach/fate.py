"""What became of each rank while `attach` read it (readings.Fate, from probe/life.py
once a second), in its parameters and its caveats: stopped (its samples then repeat
its last stack), or ended (exited, exec'd, its command changed, its PID reused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from starvecheck.core.metric import Caveat
from starvecheck.core.schema.attach import Rank
from starvecheck.stages.attach.readings import Watch
from starvecheck.stages.attach.target import Process


def of(watch: Watch, rank: Rank) -> Rank:
    """The rank's record with what became of it over the window."""
    fate = watch.fates.get(rank.pid)
    if fate is None:
        return rank
    return replace(rank, stopped_s=round(fate.stopped_s, 1), ended=fate.ended, ended_at_s=fate.at_s)


def caveats(ranks: Sequence[Process], seconds: float, watch: Watch) -> list[Caveat]:
    """A caveat for each rank stopped for half a second or more, and each that ended."""
    out: list[Caveat] = []
    for r in ranks:
        fate = watch.fates.get(r.pid)
        if fate is None:
            continue
        if fate.stopped_s >= 0.5:
            out.append(Caveat(
                "attach.job-stopped",
                f"{r.describe()} was stopped (State T: SIGSTOP or a debugger) for about "
                f"{fate.stopped_s:.0f} s of the {seconds:g} s read: its samples then "
                "repeat its last stack and cannot be told apart, so no verdict is given on it",
            ))  # fmt: skip
        if fate.ended is not None:
            out.append(Caveat(
                "attach.job-ended",
                f"{r.describe()} {fate.ended} {fate.at_s:g} s into the {seconds:g} s "
                "read: its figures are of the seconds before, and no worker count is "
                "predicted from them",
            ))  # fmt: skip
    return out
