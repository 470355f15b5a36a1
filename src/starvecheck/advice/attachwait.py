"""A rank's sampled wait for data, judged only where its evidence allows (attach): its
share of the loop's samples, the 95% interval the stage counted from the samples in the
order taken (runs of one long wait are not independent draws), the verdict the
interval allows and, where it allows none, the samples that would decide it."""

from __future__ import annotations

from dataclasses import dataclass

from starvecheck.advice.profile import HIGHLY_INPUT_BOUND, INPUT_BOUND
from starvecheck.core.intervals import Worth, percent, seconds_to_decide, side, wilson
from starvecheck.core.model import Severity, StageResult
from starvecheck.core.schema.attach import (
    Main,
    Parameters,
    Rank,
    share_of,
)
from starvecheck.core.schema.attachfigures import AttachFigures, RankFigures
from starvecheck.core.schema.figure import value_of


def _of(r: StageResult, pid: int) -> RankFigures:
    """The rank `pid`'s figures (core/schema/attachfigures.py)."""
    return r.records(AttachFigures).rank(pid)


def _rank(r: StageResult, pid: int) -> Rank:
    """The rank `pid` as the parameters record it (an empty record where they do not)."""
    return next((x for x in r.parameters.read(Parameters).ranks if x.pid == pid), Rank(pid))


@dataclass(frozen=True)
class Wait:
    """A rank's sampled wait for data: its share of `n` samples, its 95% interval, and
    the verdict the interval allows (None: it allows none, `why`, and the window that
    would decide it, `decide_s`)."""

    share: float
    n: int
    low: float
    high: float
    severity: Severity | None
    why: str = ""
    effective: float | None = None  # what the samples are worth as independent draws
    decide_s: float | None = None  # the window that would decide it, where none did

    def text(self) -> str:
        worth = ""
        if self.effective is not None and self.effective < 0.9 * self.n:
            worth = f", worth {self.effective:,.0f} independent: the wait comes in runs"
        return f"{self.share:.0%} ({percent(self.low, self.high)}, {self.n} samples{worth})"


def wait_of(r: StageResult, pid: int) -> Wait | None:
    """The verdict on a rank's wait, given only where the evidence allows one: a
    verdict (OK, warning, critical) only where the interval lies wholly on one side of
    each threshold it is judged by (advice/profile.severity: 5%, 20%); none from no
    samples, from a job stopped in the window (its samples then repeat its last
    stack), or where neither a DataLoader nor a fetch between steps was found."""
    figures = _of(r, pid)
    samples = value_of(figures.samples)
    if samples is None:
        return None
    n = int(samples)
    data = share_of(figures.main, Main.DATA)
    share = (data.value if data is not None else None) or 0.0
    low, high, worth = interval(r, pid, share, n)
    eff = worth.effective

    def none(why: str) -> Wait:
        return Wait(share, n, low, high, None, why, eff, _to_decide(r, share, worth))

    stopped = _rank(r, pid).stopped_s
    if isinstance(stopped, (int, float)) and stopped >= 0.5:
        return none(f"it was stopped (State T) for about {stopped:.0f} s of the window")
    if n == 0:
        return none("no samples of its training loop were kept")
    if _rank(r, pid).loop_found is False:
        return none(
            "no thread's samples show a training loop (a DataLoader, forward, backward, "
            "an optimizer)"
        )
    if _rank(r, pid).loop_found and _rank(r, pid).data_path is None:
        return none(
            "its data path could not be identified: no DataLoader, and nothing its loop "
            "calls between steps reads or is named for data"
        )
    below, above = side(low, high, INPUT_BOUND), side(low, high, HIGHLY_INPUT_BOUND)
    if below == -1:
        return Wait(share, n, low, high, Severity.OK, effective=eff)
    if below == 1:
        sev = Severity.CRITICAL if above == 1 else Severity.WARNING
        return Wait(share, n, low, high, sev, effective=eff)
    wait = none("")
    need = "" if wait.decide_s is None else f"about {wait.decide_s * n / seconds(r):,.0f} "
    return none(f"too few samples ({n}) to judge: {need or 'more '}needed at a {share:.0%} share")


def ci(r: StageResult, pid: int, share: float) -> str:
    """`68% (63-73%, 400 samples)`: a rank's share with its interval."""
    n = int(value_of(_of(r, pid).samples) or 0)
    low, high, _ = interval(r, pid, share, n)
    return f"{share:.0%} ({percent(low, high)}, {n} samples)"


def interval(r: StageResult, pid: int, share: float, n: int) -> tuple[float, float, Worth]:
    """(low, high, what the samples are worth) of a rank's data-wait share: as the stage
    counted it, from the samples in the order taken (core/intervals.worth; the share
    metric's `low95`, `high95`, `samples_effective`, `runs`, `clustered`); from
    Wilson's on every sample where a report of another version has none."""
    data = share_of(_of(r, pid).main, Main.DATA)
    if data is not None:
        ci = data.interval
        low, high, eff = ci.low, ci.high, ci.effective
        if low is not None and high is not None and eff is not None:
            runs = ci.runs if ci.runs is not None else n
            clustered = float(ci.clustered or 0.0)
            return float(low), float(high), Worth(n, float(eff), int(runs), clustered)
    low, high = wilson(share * n, n)
    return low, high, Worth(n, float(n), n)


def seconds(r: StageResult) -> float:
    """The window the rank was read over (the parameters' `seconds`), 1 where unknown."""
    s = r.parameters.read(Parameters).seconds
    return float(s) if isinstance(s, int | float) and s > 0 else 1.0


def _to_decide(r: StageResult, share: float, worth: Worth) -> float | None:
    """The window that would decide the share against INPUT_BOUND (the samples, their
    worth and their runs coming as in this one); None where none up to an hour does."""
    return seconds_to_decide(share, worth, seconds(r), INPUT_BOUND)
