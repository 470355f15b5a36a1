"""Which trace files are one job, and which are one rank's profiler cycles.

A folder as `tensorboard_trace_handler` leaves it holds a file per rank per profiler
cycle: a schedule that repeats (`repeat=0`, or more than 1) writes one each cycle, and
one more at exit. Each file's `distributedInfo` says its rank and its job (world size,
process groups); its events' process id says which process wrote it. So:

- the files of one rank of one job (same job, same rank, same process) are that rank's
  cycles, read as one timeline (their step numbers follow on);
- ranks of one job ran at the same time: a rank's files whose times overlap another
  rank's of the same job are one run; files that say another job, or ran at another
  time, or repeat a rank a run already has (a restarted process), are another run;
- the run analysed is the one with the most ranks (the latest of equals); the others
  are named in a caveat, never compared with it; ranks its world size has and the
  folder lacks are a caveat too.

Files without `distributedInfo` (a single process, a trace from another tool) are one
run by themselves, analysed as before: a rank per file, named by the file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from starvecheck.core.metric import Caveat
from starvecheck.stages.trace.load import Event, JobId, TraceFile, span

SLACK_US = 1e6  # ranks' clocks (several hosts) may differ by this much and still overlap


@dataclass
class Run:
    """One job's files: each rank's, in time order."""

    job: JobId
    ranks: dict[int, list[TraceFile]] = field(default_factory=dict)
    start: float = float("inf")  # µs on the files' own clock (baseTimeNanoseconds)
    end: float = float("-inf")
    unranked: list[TraceFile] = field(default_factory=list)

    @property
    def files(self) -> list[TraceFile]:
        return [f for r in sorted(self.ranks) for f in self.ranks[r]] + self.unranked

    def timelines(self) -> list[TraceFile]:
        """The files to analyse: each rank's cycles as one file, in rank order."""
        return [one_timeline(self.ranks[r]) for r in sorted(self.ranks)] + self.unranked

    def overlaps(self, start: float, end: float) -> bool:
        return start <= self.end + SLACK_US and end >= self.start - SLACK_US

    def describe(self) -> str:
        if not self.ranks:
            return f"{len(self.unranked)} file(s) without distributedInfo"
        size = f"world size {self.job.world_size}" if self.job.world_size else "world size unknown"
        ranks = _spans(sorted(self.ranks))
        names = ", ".join(os.path.basename(f.path) for f in self.files[:3])
        more = f", and {len(self.files) - 3} more" if len(self.files) > 3 else ""
        return f"{size}, rank(s) {ranks} in {len(self.files)} file(s) ({names}{more})"


def _window(f: TraceFile) -> tuple[float, float, frozenset[object]]:
    """The file's first start and last end (on its own clock) and the processes whose
    events it holds."""
    lo, hi = float("inf"), float("-inf")
    pids: set[object] = set()
    for e in f.events:
        s = span(e)
        if s is None:
            continue
        lo, hi = min(lo, s[0]), max(hi, s[1])
        if type(e.pid) is int:
            pids.add(e.pid)
    return lo + f.base_us, hi + f.base_us, frozenset(pids)


def split_runs(files: Sequence[TraceFile]) -> list[Run]:
    """The runs among the files, the largest first (see the module docstring)."""
    unranked = [f for f in files if f.rank is None]
    cycles: dict[tuple[JobId, int, frozenset[object]], list[tuple[float, float, TraceFile]]] = {}
    for f in files:
        if f.rank is not None:
            lo, hi, pids = _window(f)
            cycles.setdefault((f.job, f.rank, pids), []).append((lo, hi, f))
    groups = sorted(
        (
            (min(lo for lo, _, _ in c), max(hi for _, hi, _ in c), key, c)
            for key, c in cycles.items()
        ),
        key=lambda g: (g[0], g[2][1]),
    )
    runs: list[Run] = []
    for lo, hi, (job, rank, _), found in groups:
        run = next(
            (r for r in runs if r.job == job and rank not in r.ranks and r.overlaps(lo, hi)), None
        )
        if run is None:
            run = Run(job)
            runs.append(run)
        run.ranks[rank] = [f for _, _, f in sorted(found, key=lambda c: c[0])]
        run.start, run.end = min(run.start, lo), max(run.end, hi)
    if unranked:
        runs.append(Run(JobId(), unranked=unranked))
    return sorted(runs, key=lambda r: (len(r.ranks) + len(r.unranked), r.start), reverse=True)


def one_timeline(files: Sequence[TraceFile]) -> TraceFile:
    """One rank's cycles as one file: their events on the first file's clock."""
    first = files[0]
    if len(files) == 1:
        return first
    events: list[Event] = []
    for f in files:
        shift = f.base_us - first.base_us
        if shift:
            events += [_shifted(e, shift) for e in f.events]
        else:
            events += f.events
    return TraceFile(first.path, events, first.rank, first.job, first.base_us)


def _shifted(e: Event, by: float) -> Event:
    if type(e.ts) not in (int, float):
        return e
    return Event(e.ph, e.name, e.cat, e.ts + by, e.dur, e.pid, e.tid, e.args)


def choose(files: Sequence[TraceFile]) -> tuple[list[TraceFile], list[Caveat], list[Run]]:
    """The files of the run to analyse, each rank's cycles as one; what to say about
    the rest; every run, the analysed one first."""
    runs = split_runs(files)
    run = runs[0]
    caveats: list[Caveat] = []
    if len(runs) > 1:
        others = "; ".join(f"run {i + 2}: {r.describe()}" for i, r in enumerate(runs[1:6]))
        if len(runs) > 6:
            others += f"; and {len(runs) - 6} more"
        caveats.append(
            Caveat(
                "trace.mixed-runs",
                f"the files are of {len(runs)} runs, never compared as one job: this report is "
                f"run 1's ({run.describe()}); {others}. Pass a run's own files to judge it",
            )
        )
    cycles = {r: len(fs) for r, fs in run.ranks.items() if len(fs) > 1}
    if cycles:
        n = sorted(set(cycles.values()))
        caveats.append(
            Caveat(
                "trace.cycles",
                f"{len(cycles)} rank(s) wrote {'-'.join(map(str, n))} files each, one per "
                "profiler cycle (a schedule that repeats): each rank's cycles are read as one "
                "timeline"
                + (
                    ", and ranks are compared over the steps they all have, in every cycle"
                    if len(run.ranks) > 1
                    else ""
                ),
            )
        )
    size = run.job.world_size
    if size and run.ranks:
        missing = _gaps(sorted(run.ranks), size)
        if missing:
            count = sum(b - a + 1 for a, b in missing)
            caveats.append(
                Caveat(
                    "trace.missing-ranks",
                    f"{count} of the job's {size} ranks have no trace here (rank(s) "
                    f"{_said(missing)}): the figures are of rank(s) "
                    f"{_spans(sorted(run.ranks))} alone, and a straggler among the missing "
                    "cannot be seen",
                )
            )
    return run.timelines(), caveats, runs


def _gaps(ranks: Sequence[int], size: int) -> list[tuple[int, int]]:
    """The ranks of 0..size-1 not in `ranks` (sorted), as inclusive runs: counted from
    the ranks present, so a world size of a million costs what the folder holds."""
    out, at = [], 0
    for r in [*ranks, size]:
        if r > at:
            out.append((at, min(r, size) - 1))
        at = max(at, r + 1)
        if at >= size:
            break
    return out


def _said(runs: Sequence[tuple[int, int]], most: int = 20) -> str:
    """Inclusive runs of ranks as `0-3, 5, 7-8`, the first `most` of them."""
    text = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:most]]
    more = f", and {len(runs) - most} more" if len(runs) > most else ""
    return ", ".join(text) + more


def _spans(ranks: Sequence[int]) -> str:
    """0-3, 5, 7-8."""
    runs: list[tuple[int, int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    return _said(runs)
