"""A watched loop's wait split over the stages of loading (core/schema/loading.py),
step by step: what loading/tap.py hands over, kept beside the loop's own arrays
(loop/times.py) and made into metrics with them.

Each step's exposed seconds by stage are one array a stage, NaN where the step was not
split (no record of its batch), so a step's figures line up with its wait and a rank's
last steps are sent as its waits are. The busy seconds (each stage's time per batch
wherever it ran) are summed: nothing reads them step by step. Each pass's worker
start-up (loading/tap.Startup) is kept as a list.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import LoadFigures, LoadStage, StageWait
from starvecheck.loading.split import STAGES
from starvecheck.loading.tap import Startup, Tap

if TYPE_CHECKING:
    from starvecheck.loading.alone import Alone

NAN = float("nan")
ALONE_MEASURED = "watch.alone-measured"
ALONE_UNMEASURED = "watch.alone-unmeasured"


def tap_for(iterable: Any, split: StageSplit, clock: Any) -> Tap | None:
    """The stage split's side in the training process (loading/tap.py) for a loop over
    `iterable`: where it is a torch DataLoader and the loop runs on perf_counter's clock
    (the workers'); None otherwise. Writes how the workers start into `split`."""
    from starvecheck.core import clocks

    tap = Tap.of(iterable, split)
    if tap is None or clock is not clocks.perf_counter:
        return None
    split.start_method, split.persistent, split.pinned = tap.method, tap.persistent, tap.pinned
    return tap


def _stage_arrays() -> dict[LoadStage, array[float]]:
    return {s: array("d") for s in STAGES}


@dataclass
class StageSplit:
    """The stage split of one loop (see the module's docstring)."""

    exposed: dict[LoadStage, array[float]] = field(default_factory=_stage_arrays)
    busy: list[float] = field(default_factory=lambda: [0.0] * len(STAGES))
    busy_batches: int = 0
    solo: float = 0.0  # the batches' seconds made alone (loading/split.solo), summed
    startups: list[Startup] = field(default_factory=list)
    pass_starts: list[int] = field(default_factory=list)  # each pass's first step
    start_method: str | None = None
    persistent: bool | None = None
    pinned: bool | None = None
    # a batch made at num_workers=0 in a fresh process (loading/alone.py; this process's
    # own loop, never a rank's sent: loop/reporting.py measures it once)
    alone: Alone | None = None

    def put(self, step: int, exposed: list[float], busy: list[float], solo: float = 0.0) -> None:
        """Step `step`'s split (loading/tap.Sink): the arrays grow to it with NaN."""
        self.solo += solo
        for s, v in zip(STAGES, exposed, strict=True):
            a = self.exposed[s]
            if len(a) <= step:
                a.extend([NAN] * (step + 1 - len(a)))
            a[step] = v
        self.busy = [a + b for a, b in zip(self.busy, busy, strict=True)]
        self.busy_batches += 1

    def cut(self, steps: int) -> None:
        """Forget the steps from `steps` on (a step that never finished)."""
        for a in self.exposed.values():
            del a[steps:]

    def metrics(self, waits: array[float], first: int) -> list[Metric]:
        """Each stage's exposed ms a step and share of the wait, over the steps split
        from `first` on (the loop's own figures leave the same warm-up out), the busy
        ms a batch, and each pass's start-up."""
        return list(self.figures(waits, first).to_metrics())

    def figures(
        self, waits: array[float], first: int, computes: array[float] | None = None
    ) -> LoadFigures:
        """The split as its record (core/schema/loading.LoadFigures); with `computes`,
        the mean step over the steps split too."""
        read = self.exposed[STAGES[0]]
        steps = [i for i in range(first, min(len(waits), len(read))) if not math.isnan(read[i])]
        stages = {s: StageWait(s) for s in STAGES}
        split = restart = solo = startup = unpickle = step = None
        passes: tuple[Figure | None, ...] = (None, None, None)
        if steps:
            wait = sum(waits[i] for i in steps)
            split = Figure.single(len(steps))
            if computes is not None and len(computes) >= steps[-1] + 1:
                step = Figure.single((wait + sum(computes[i] for i in steps)) / len(steps) * 1e3)
            for s in STAGES:
                total = sum(self.exposed[s][i] for i in steps)
                share = total / wait if wait > 0 else 0.0
                mean = Figure.single(total / len(steps) * 1e3)
                stages[s] = replace(stages[s], exposed_ms=mean, exposed_share=Figure.single(share))
            if not self.persistent and len(self.pass_starts) > 1:
                # Over the later passes' own steps: a pass's restart spread over the
                # pass, as every epoch after a job's first pays it.
                later = [i for i in steps if i >= self.pass_starts[1]]
                a = self.exposed[LoadStage.STARTUP]
                if later:
                    restart = Figure.single(sum(a[i] for i in later) / len(later) * 1e3)
                    if computes is not None and len(computes) > later[-1]:
                        # every step of the later passes up to the last split, split or
                        # not (a trainer one batch ahead at num_workers=0 splits no
                        # pass's first step: it was made before the pass's first wait)
                        whole = list(range(self.pass_starts[1], later[-1] + 1))
                        passes = _later(whole, self.pass_starts, waits, computes)
        if self.busy_batches:
            for s, total in zip(STAGES, self.busy, strict=True):
                busy = Figure.single(total / self.busy_batches * 1e3)
                stages[s] = replace(stages[s], busy_ms=busy)
            solo = Figure.single(self.solo / self.busy_batches * 1e3)
        if self.startups:
            startup = Figure.repeated([u.slowest_s for u in self.startups])
            unpickle_s = [u.unpickle_s for u in self.startups if u.unpickle_s is not None]
            unpickle = Figure.repeated(unpickle_s) if unpickle_s else None
        waits_by = tuple(w for w in stages.values() if w != StageWait(w.stage))
        alone = release = None
        if self.alone is not None and self.alone.measured:
            alone = Figure.repeated([t * 1e3 for t in self.alone.batch_s])
            if self.alone.release_s:
                release = Figure.repeated([t * 1e3 for t in self.alone.release_s])
        return LoadFigures(
            split, waits_by, restart, solo, startup, unpickle, alone, release, step, *passes
        )

    def caveats(self, waits: int, first: int) -> list[Caveat]:
        out = self._alone_caveats()
        read = self.exposed[STAGES[0]]
        split = sum(1 for i in range(first, min(waits, len(read))) if not math.isnan(read[i]))
        if split == 0 or split >= waits - first:
            return out
        return [
            *out,
            Caveat(
                "watch.split-partial",
                f"the wait was split by stage in {split} of {waits - first} steps (the others' "
                "batches carried no record: workers started before the watch, or another "
                "kind of iterator)",
            ),
        ]

    def _alone_caveats(self) -> list[Caveat]:
        """What timing batches at num_workers=0 in a fresh process cost the loop, or why
        it timed none."""
        a = self.alone
        if a is None:
            return []
        if a.measured:
            said = (
                f"to predict num_workers=0, {len(a.batch_s)} batches were made at "
                f"num_workers=0 on {a.threads} intra-op threads in a fresh process given a "
                f"copy of the dataset; the loop waited {a.took_s:,.1f} s for it, once"
            )
            return [Caveat(ALONE_MEASURED, said)]
        said = f"num_workers=0 could not be timed in a fresh process: {a.why}"
        return [Caveat(ALONE_UNMEASURED, said)]

    def parameters(self) -> dict[str, Any]:
        return {
            "start_method": self.start_method,
            "persistent_workers": self.persistent,
            "pin_memory": self.pinned,
        }

    # The exchange between ranks (loop/times.py's encoding carries these)

    def encode(self, cut: int) -> dict[str, Any]:
        return {
            "exposed": {s.value: list(self.exposed[s][cut:]) for s in STAGES},
            "busy": self.busy,
            "busy_batches": self.busy_batches,
            "solo": self.solo,
            # Past a cut, the window's start stands for the run's first pass (its later
            # passes are restarts whatever the window shows of them).
            "pass_starts": ([0] if cut else []) + [p - cut for p in self.pass_starts if p > cut]
            if cut
            else self.pass_starts,
            "startups": [
                [u.slowest_s, u.mean_s, u.unpickle_s, u.init_s, u.workers] for u in self.startups
            ],
            **self.parameters(),
        }

    @classmethod
    def decode(cls, p: Mapping[str, Any] | None) -> StageSplit:
        """A rank's split as it sent it; what does not read is left out, never raised."""
        out = cls()
        if not isinstance(p, Mapping):
            return out
        try:
            for s in STAGES:
                out.exposed[s] = array("d", [float(v) for v in p["exposed"].get(s.value, ())])
            busy = [float(v) for v in p.get("busy", ())]
            if len(busy) == len(STAGES):
                out.busy, out.busy_batches = busy, int(p.get("busy_batches", 0))
                out.solo = float(p.get("solo", 0.0))
            out.pass_starts = [int(x) for x in p.get("pass_starts", ())]
            out.startups = [
                Startup(float(a), float(b), None if c is None else float(c),
                        None if d is None else float(d), int(e))
                for a, b, c, d, e in p.get("startups", ())
            ]  # fmt: skip
        except (TypeError, ValueError, KeyError, AttributeError):
            return cls()
        method, persistent, pinned = (
            p.get(k) for k in ("start_method", "persistent_workers", "pin_memory")
        )
        out.start_method = method if isinstance(method, str) else None
        out.persistent = persistent if isinstance(persistent, bool) else None
        out.pinned = pinned if isinstance(pinned, bool) else None
        return out


def restart_wait_ms(waits: Sequence[float], first: int, pass_starts: Sequence[int]) -> float | None:
    """The later passes' first waits beyond their own pass's median wait, in ms a step
    over the steps from `first` on: each pass after the run's first starts its workers
    again (or, with persistent ones, asks for its first batches anew) and waits for one
    worker's whole batch, which more workers do not shorten. None where no later pass
    began among those steps. A start at 0 is the run's (or a rank's window's) own."""
    n = len(waits)
    starts = sorted({s for s in pass_starts if 0 < s < n and s >= first})
    if not starts:
        return None
    excess = 0.0
    for s, end in zip(starts, [*starts[1:], n], strict=True):
        usual = statistics.median(waits[s + 1 : end]) if end > s + 1 else 0.0
        excess += max(0.0, waits[s] - usual)
    return excess / (n - first) * 1e3


def _later(
    later: list[int], pass_starts: Sequence[int], waits: Sequence[float], computes: Sequence[float]
) -> tuple[Figure | None, ...]:
    """The later passes' steps `later`: their mean step, the mean of those that neither
    began nor ended a pass, and a pass's mean steps (LoadFigures' later_*); none where no
    pass began among them or every one did. A pass's last step holds its workers' stop
    where the loop fetches a batch ahead (accelerate's DataLoaderShard: 47-60 ms a pass
    on 2 forkserver workers, where the steps around it took 12-13): persistent workers never
    stop, so the steady step leaves it out. The run's last step ends a pass where its
    pass ran as long as the one before."""
    starts = set(pass_starts)
    begun = sum(1 for i in later if i in starts)
    ordered = sorted(starts)
    ends = {s - 1 for s in ordered}
    if len(ordered) >= 2 and later and later[-1] + 1 - ordered[-1] == ordered[-1] - ordered[-2]:
        ends.add(later[-1])
    steady = [waits[i] + computes[i] for i in later if i not in starts and i not in ends]
    if not steady:  # passes of a step or two: only their first left out
        steady = [waits[i] + computes[i] for i in later if i not in starts]
    if not begun or not steady:
        return (None, None, None)
    mean = sum(waits[i] + computes[i] for i in later) / len(later)
    return (
        Figure.single(mean * 1e3),
        Figure.single(statistics.fmean(steady) * 1e3),
        Figure.single(len(later) / begun),
    )
