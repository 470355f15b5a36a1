"""`starvecheck attach PID --every SECONDS --prometheus PORT`: each window's report added
to the metric families `watch` exports (loop/families.py), so a sidecar that reads a
job it cannot change feeds the same rules and dashboard (docs/fleet.md).

attach samples a rank's stacks for a window and reads the share of them in which the
loop waits for data; it counts no steps. So here a window of S seconds adds S to a
rank's `starvecheck_step_seconds_total` and its share of S to
`starvecheck_data_wait_seconds_total`: their rate's ratio is the sampled share, as
watch's is its timed one. The last window's share is a gauge with its 95% Wilson
interval (`_low`, `_high`), beside the stack samples read and the windows counted; the
recommendation (num_workers, the predicted speed-up) is the one the window's report
gives, on the rank it names. Labels: the job's (STARVECHECK_JOB, else the rank's
script), this host's, the rank's (loop/identity.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starvecheck.core.intervals import wilson
from starvecheck.core.model import GainKind
from starvecheck.core.report import Report
from starvecheck.core.schema.attach import Main, share_of
from starvecheck.core.schema.attach import Parameters as AttachParameters
from starvecheck.core.schema.attachfigures import AttachFigures
from starvecheck.core.schema.figure import value_of
from starvecheck.loop.families import PREFIX
from starvecheck.loop.identity import job_name, labels

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric as PromMetric

DATA, STEP = "data loading", "training step"
INPUT_BOUND = 0.05  # advice/profile.INPUT_BOUND: from here the data is the weakest link


@dataclass
class Rank:
    """One rank's windows so far."""

    labels: dict[str, str]
    wait_s: float = 0.0
    seconds: float = 0.0
    samples: int = 0
    windows: int = 0
    share: float | None = None
    low: float | None = None
    high: float | None = None
    recommended: int | None = None
    speedup: float | None = None


class Windows:
    """The collector: `add(report)` after each window; a scrape calls `collect()`."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.ranks: dict[int, Rank] = {}
        self._lock = threading.Lock()

    def add(self, report: Report) -> None:
        """A window's report: each rank read in it, its samples' share of data wait."""
        stage = report.stages[0]
        p = stage.parameters.read(AttachParameters)
        seconds = float(p.seconds or 0.0)
        fix = next((f for f in stage.findings if "num_workers" in f.fix), None)
        figures = stage.records(AttachFigures)
        read: dict[int, float] = {}
        with self._lock:
            for r in p.ranks:
                pid, rank_no = r.pid, r.rank
                m = figures.rank(pid)
                n = value_of(m.samples)
                if not n or seconds <= 0:
                    continue  # no stack read this window: nothing to add
                d = share_of(m.main, Main.DATA)
                share = (d.value if d is not None else None) or 0.0
                rank = self.ranks.get(pid) or self._rank(pid, rank_no, r.command)
                self.ranks[pid] = rank
                rank.wait_s += share * seconds
                rank.seconds += seconds
                rank.samples += int(n)
                rank.windows += 1
                rank.share = share
                # the interval the window's stage counted (from the samples in order)
                low, high = (d.interval.low, d.interval.high) if d else (None, None)
                if low is not None and high is not None:
                    rank.low, rank.high = float(low), float(high)
                else:
                    rank.low, rank.high = wilson(share * n, n)
                rank.recommended = rank.speedup = None
                read[pid] = share
            if fix is not None and read:  # judged on the rank that waits most (advice/attach)
                rank = self.ranks[max(read, key=lambda k: read[k])]
                rank.recommended = fix.fix["num_workers"]
                if fix.gain is not None and fix.gain.kind is GainKind.THROUGHPUT:
                    rank.speedup = fix.gain.value

    def _rank(self, pid: int, rank: object, command: object) -> Rank:
        script = _script(command)
        got = labels(self.environ, rank=rank if isinstance(rank, int) else None, argv0=script)
        got["job"] = job_name(self.environ, script)
        got.pop("local_rank", None)  # not known from outside the process
        got["pid"] = str(pid)
        return Rank(got)

    def collect(self) -> Iterator[PromMetric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            ranks = list(self.ranks.values())
        if not ranks:
            return
        names = list(ranks[0].labels)
        counters = {
            "data_wait_seconds": ("Seconds the loop waited for data: each window's sampled "
                                  "share of its seconds (attach).", lambda r: r.wait_s),
            "step_seconds": ("Seconds of the loop read (attach's windows).", lambda r: r.seconds),
            "attach_samples": ("Stack samples of the loop read.", lambda r: r.samples),
            "attach_windows": ("Windows read.", lambda r: r.windows),
        }  # fmt: skip
        for name, (doc, get) in counters.items():
            c = CounterMetricFamily(PREFIX + name, doc, labels=names)
            for r in ranks:
                c.add_metric([r.labels[k] for k in names], get(r))
            yield c
        gauges = {
            "data_wait_ratio": ("The last window's sampled data-wait share.", "share"),
            "data_wait_ratio_low": ("Its 95% interval's low end (Wilson).", "low"),
            "data_wait_ratio_high": ("Its 95% interval's high end (Wilson).", "high"),
            "recommended_num_workers": ("num_workers the worker model recommends.",
                                        "recommended"),
            "predicted_speedup": ("Predicted throughput with it over now.", "speedup"),
        }  # fmt: skip
        for name, (doc, attr) in gauges.items():
            g = GaugeMetricFamily(PREFIX + name, doc, labels=names)
            for r in ranks:
                if (v := getattr(r, attr)) is not None:
                    g.add_metric([r.labels[k] for k in names], v)
            yield g
        g = GaugeMetricFamily(PREFIX + "weakest_link", "1 for the link that bounds the "
                              "loop now.", labels=[*names, "link"])  # fmt: skip
        for r in ranks:
            if r.share is not None:
                link = DATA if r.share >= INPUT_BOUND else STEP
                g.add_metric([*(r.labels[k] for k in names), link], 1.0)
        yield g


def _script(command: object) -> str:
    """The rank's script from its command line (`python train.py ...`: train.py)."""
    words = command.split() if isinstance(command, str) else list(command or [])
    for w in words:
        if isinstance(w, str) and w.endswith(".py"):
            return w
    return os.path.basename(str(words[0])) if words else "attach"
