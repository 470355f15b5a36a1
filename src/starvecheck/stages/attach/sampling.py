"""The py-spy processes of one `attach`, kept within attach's CPU budget (budget.py).

For each rank: one py-spy on the rank (its threads) and one on each of its DataLoader
workers found from /proc (at most budget.MAX_WORKERS; workers that start later, a new
epoch's, are added while there is room), all at one rate chosen from the threads they
hold. About a second in, py-spy's own CPU is read from /proc: where it takes more than
the budget, every py-spy is restarted once at the rate that fits (the samples of that
first second are dropped, so that every sample counts at one rate); where it takes far
less (the threads counted were not all Python's: a CUDA job's driver, NCCL and OpenMP
threads cost py-spy little), every py-spy is restarted once at the higher rate that
fits, where that gives more samples in the time left (budget.raise_rate), and checked
again. What was dropped,
not taken, not sampled, and what attach's sampling took, is in `cost()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starvecheck.core import clocks
from starvecheck.stages.attach import budget, spy

if TYPE_CHECKING:
    from starvecheck.scratch.directory import Scratch

CHECK_AFTER_S = 1.0  # py-spy's CPU is read over its first second, after its start-up
START_S = 0.3  # py-spy's own start-up (reading the target's symbols), not its steady cost


@dataclass
class RankSampler:
    """A rank's py-spys: the rank's, its workers'. `stacks()` merges their samples."""

    pid: int
    rank: spy.Recorder
    workers: dict[int, spy.Recorder] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)  # workers found but not sampled
    taken: int = 0  # samples of the rank (its most sampled thread's): intervals taken
    expected: int = 0  # intervals its rate and the seconds it ran should have given
    progress: spy.Progress = field(default_factory=spy.Progress)
    window_s: float = float("inf")  # seconds it was to sample, where cut short (budget)

    def all(self) -> list[spy.Recorder]:
        return [self.rank, *self.workers.values()]

    def done(self) -> bool:
        return all(r.done() for r in self.all())

    def stop(self) -> None:
        spy.stop_all(self.all())

    def stacks(self) -> spy.Stacks:
        """The rank's samples and its workers' (a worker py-spy could not read is left
        out: its worker is counted as not sampled). NotAllowed or RuntimeError where the
        rank's own could not be read."""
        out = self.rank.stacks()
        mine = [out.count(k) for k in out.by_thread if k[0] == self.pid]
        self.taken = max(mine, default=0)
        ran = min(float(self.rank.seconds), self.rank.ran_s - START_S, self.window_s)
        ran = max(0.0, ran)
        self.expected = budget.samples_expected(self.rank.rate, ran)
        self.progress = spy.parse_progress(self.rank.printed())
        for pid, rec in self.workers.items():
            try:
                _merge(out, rec.stacks())
            except (spy.NotAllowed, RuntimeError):
                self.skipped.add(pid)
        return out


def _merge(into: spy.Stacks, more: spy.Stacks) -> None:
    for key, samples in more.by_thread.items():
        before = into.by_thread.setdefault(key, [])
        if key in more.order and (key in into.order or not before):
            into.order.setdefault(key, []).extend(len(before) + i for i in more.order[key])
        else:  # one of them gave no order: the thread has none
            into.order.pop(key, None)
        before.extend(samples)
    for key, name in more.thread_names.items():
        into.thread_names.setdefault(key, name)
    for pid, command in more.commands.items():
        into.commands.setdefault(pid, command)
    into.samples += more.samples
    into.errors += more.errors


@dataclass(frozen=True)
class Cost:
    """What attach's sampling did and took, for the result."""

    rate: int  # the rate it sampled at, after any change
    requested: int
    budget_cpus: float
    threads: int  # threads of the processes sampled, when it chose the rate
    lowered: str | None  # why the rate is below the one asked for, where it is
    spy_cpu_s: float  # py-spy's CPU seconds, every py-spy together (restarts too)
    seconds: float  # the window
    sample_s: float  # the seconds of it sampled (fewer where even 1/s is over budget)
    per_sample_cpu_s: float  # py-spy's CPU seconds a sample, every process together
    measured: bool  # per_sample_cpu_s measured (else estimated from the threads)
    steady_cpus: float | None  # py-spy's CPUs past its start-up, where read over 1 s or more
    over_budget: bool  # py-spy took more than the budget all the same (the lowest rate)
    refit: bool  # restarted at a lower rate after measuring itself
    first_rate: int = 0  # the rate it started at (another where restarted)
    raised: bool = False  # restarted at a higher rate after measuring itself

    @property
    def spy_cpus(self) -> float:
        return self.spy_cpu_s / self.seconds if self.seconds > 0 else 0.0


class Sampling:
    """Every rank's py-spys, one budget. `tick()` once a second while sampling."""

    def __init__(
        self,
        ranks: dict[int, list[int]],
        seconds: float,
        requested: int,
        binary: str,
        scratch: Scratch,
        effective_cpus: int,
        idle_cpus: float | None = None,
    ) -> None:
        self.seconds = seconds
        self.requested = max(1, min(int(requested), spy.RATE_CEILING))
        self.binary = binary
        self.scratch = scratch
        self.idle_cpus = idle_cpus
        self.samplers: dict[int, RankSampler] = {}
        self._retired: list[spy.Recorder] = []  # py-spys ended by a restart
        self._found = {r: budget.workers_of(r, kids) for r, kids in ranks.items()}
        # Children already judged (workers or not), and whether the rank's workers are
        # told by name (torch 2.3+): a child judged once is not read again each second.
        self._judged = {r: set(kids) for r, kids in ranks.items()}
        self._named = {
            r: any(budget.is_named_worker(w) for w in ws) for r, ws in self._found.items()
        }
        self.threads = sum(
            budget.threads_of(p) or 1 for r, ws in self._found.items() for p in (r, *ws)
        )
        self.budget = budget.sampling_budget(effective_cpus, idle_cpus, self.threads)
        self.rate = budget.choose_rate(self.requested, self.threads, self.budget)
        # Where even 1 a second costs more than the budget: none sampled where not one
        # second would fit even at half the estimate (thousands of threads on a small
        # machine); else the whole window, cut short once py-spy's measured CPU says how
        # many seconds fit (`_check`).
        hopeful = budget.COST_PER_THREAD_S / 2
        fits = budget.sample_seconds(self.rate, self.threads, self.budget, seconds, hopeful)
        self.sample_s = seconds if fits >= 1.0 else 0.0
        self.per_sample_cpu_s = self.threads * budget.COST_PER_THREAD_S  # estimated
        self.measured = False
        self._stop_at: float | None = None
        self.refit = False  # restarted at a lower rate after measuring itself
        self._checked = False
        self._t0 = self._at0 = clocks.monotonic()
        self._cpu0: float | None = None
        self._since = self._t0  # when the py-spys running now started
        self._readings: list[tuple[float, float]] = []  # (time, their CPU) past start-up
        self.first_rate = self.rate
        self.used_first: float | None = None  # py-spy's CPUs over its first second, if over
        self.raised = False  # restarted at a higher rate: it cost less than estimated
        self.refit_from = self.rate  # the rate it was measured over budget at
        if self.sample_s >= 1.0:
            try:
                for r in ranks:
                    self.samplers[r] = self._start(r, self._found[r], self.sample_s)
            except BaseException:  # py-spy could not be started (or an interrupt)
                self.stop()
                raise

    def _start(self, rank: int, workers: list[int], seconds: float) -> RankSampler:
        s = RankSampler(rank, self._recorder(rank, seconds))
        for w in workers:
            self._add(s, w, seconds)
        return s

    def _recorder(self, pid: int, seconds: float) -> spy.Recorder:
        return spy.Recorder(pid, seconds, self.rate, self.binary, self.scratch)

    def _add(self, s: RankSampler, worker: int, seconds: float) -> None:
        if worker in s.workers or worker in s.skipped:
            return
        live = [p for p, r in s.workers.items() if not r.done()]
        if len(live) >= budget.MAX_WORKERS or seconds < 1.0:
            s.skipped.add(worker)
            return
        try:
            s.workers[worker] = self._recorder(worker, seconds)
        except OSError:  # a worker's py-spy could not start: counted as not sampled
            s.skipped.add(worker)

    def recorders(self) -> list[spy.Recorder]:
        return [r for s in self.samplers.values() for r in s.all()] + self._retired

    def tick(self, descendants: dict[int, list[int]]) -> None:
        """Once a second: py-spy's CPU over its first second checked against the budget
        (restarted once, slower, where over; faster, where well under: `_check`);
        workers started since sampled too."""
        now = clocks.monotonic()
        if now - self._since >= START_S and not self.done():  # while they all still run
            self._readings.append((now, self._cpu()))
        if self._cpu0 is None and now - self._since >= START_S:
            self._cpu0, self._at0 = self._cpu(), now
        elif self._cpu0 is not None and not self._checked and now - self._at0 >= self._over():
            self._check()
        if self._stop_at is not None and now >= self._stop_at:
            self._stop_at = None
            self.sample_s = min(self.sample_s, now - self._t0)
            for rank in self.samplers.values():
                rank.window_s = self.sample_s
            self.stop()
        left = self.sample_s - (clocks.monotonic() - self._t0)
        for rank, kids in descendants.items():
            s = self.samplers.get(rank)
            judged = self._judged.setdefault(rank, set())
            new = [k for k in kids if k not in judged]
            judged.update(new)
            if s is not None and new:
                for w in budget.workers_of(rank, new, self._named.get(rank, False)):
                    self._add(s, w, left)

    def next_in(self) -> float:
        """Seconds until py-spy's cost is next due to be read (its first reading past its
        start-up, then its check); a second once it has been checked."""
        now = clocks.monotonic()
        if self._checked or not self.samplers:
            return 1.0
        if self._cpu0 is None:
            return max(0.0, self._since + START_S - now)
        return max(0.0, self._at0 + self._over() - now)

    def _over(self) -> float:
        """Seconds py-spy's CPU is read over before it is judged: a second, or two
        samples' worth at a low rate (one sample a second read over one second is 0 or
        1 samples' cost; its CPU is read in nanoseconds, so two are enough to judge)."""
        return max(CHECK_AFTER_S, 2.0 / self.rate)

    def _cpu(self) -> float:
        return sum(r.cpu_now() or 0.0 for s in self.samplers.values() for r in s.all())

    def _check(self) -> None:
        """Once: py-spy's CPU over the last second against the budget; where over,
        every py-spy ended (its samples dropped) and started again at the rate that fits;
        where well under (the threads counted were not all Python's), started again once
        at a higher rate where that gives more samples in the time left, and checked
        again (lowered where the higher rate is over after all)."""
        self._checked = True
        now = clocks.monotonic()
        span = max(1e-3, now - self._at0)
        used = (self._cpu() - (self._cpu0 or 0.0)) / span
        self.per_sample_cpu_s, self.measured = used / self.rate, True
        rate = budget.refit_rate(self.rate, used, self.budget)
        faster = None
        if rate is None and not self.raised and not self.refit:
            left = self.sample_s - (now - self._t0)
            faster = budget.raise_rate(self.rate, self.requested, used * span, span,
                                       len(self._live()), self.budget, left, self.sample_s,
                                       START_S)  # fmt: skip
        if faster is not None:
            self._restart(faster)
            self.raised, self._checked, self._cpu0 = True, False, None
            return
        if rate is None:
            if self.rate == 1 and used > self.budget * budget.REFIT_OVER:
                # The lowest rate, still over: stop once the window's budget is spent
                # (what py-spy took so far, its start-up included, counted first).
                left = self.budget * self.seconds - self._cpu()
                self._stop_at = now + max(0.0, left / used)
            return
        self.refit, self.used_first, self.refit_from = True, used, self.rate
        self._restart(rate)

    def _live(self) -> list[spy.Recorder]:
        return [r for s in self.samplers.values() for r in s.all() if not r.done()]

    def _restart(self, rate: int) -> None:
        """Every py-spy ended (its samples dropped) and started again at `rate` for the
        rest of the window."""
        self.rate = rate
        self._since, self._readings = clocks.monotonic(), []
        left = max(1.0, self.sample_s - (clocks.monotonic() - self._t0))
        for rank, s in list(self.samplers.items()):
            workers = [w for w, r in s.workers.items() if not r.done()]
            # The new ones first, then the old ended: never a moment without a py-spy
            # (a reader of attach, tests/loops/loopstate.attach_beside, takes the window
            # from py-spy's start to its end).
            self.samplers[rank] = self._start(rank, workers, left)
            self.samplers[rank].skipped |= s.skipped
            for r in s.all():
                r.kill()
                self._retired.append(r)

    def steady_cpus(self) -> float | None:
        """py-spy's CPUs past its start-up (reading the target's symbols): its cost at
        the rate chosen, from readings a second or more apart; None where fewer."""
        if len(self._readings) < 2 or self._readings[-1][0] - self._readings[0][0] < 1.0:
            return None
        (t0, c0), (t1, c1) = self._readings[0], self._readings[-1]
        return max(0.0, (c1 - c0) / (t1 - t0))

    def stop(self) -> None:
        """Every py-spy asked to end at once, then waited for together, at most
        spy.STOP_S, before every group still there is killed (spy.stop_all)."""
        spy.stop_all(self.recorders())

    def done(self) -> bool:
        return all(s.done() for s in self.samplers.values())

    def cost(self) -> Cost:
        """What sampling took, once every py-spy has ended."""
        spent = sum(r.cpu_now() or 0.0 for r in self.recorders())
        lowered = None
        if self.rate < self.requested:
            if self.refit:
                why = f"py-spy took {self.used_first or 0:.2f} CPUs at {self.refit_from}/s"
            elif self.raised:
                why = (
                    f"{self.threads:,} threads to sample (py-spy, measured at "
                    f"{self.first_rate}/s, was restarted at {self.rate}/s)"
                )
            else:
                why = f"{self.threads:,} threads to sample"
            lowered = (
                f"{why}; attach keeps its sampling within {self.budget:.2f} CPUs "
                f"({budget.BUDGET_SHARE:.0%} of the machine's, or a quarter of the CPUs it "
                f"left idle, up to {budget.IDLE_CAP:.0%})"
            )
        steady = self.steady_cpus()
        took = steady if steady is not None else (spent / self.seconds if self.seconds else 0.0)
        over = took > self.budget * budget.REFIT_OVER
        return Cost(
            self.rate,
            self.requested,
            self.budget,
            self.threads,
            lowered,
            spent,
            self.seconds,
            self.sample_s,
            self.per_sample_cpu_s,
            self.measured,
            steady,
            over,
            self.refit,
            self.first_rate,
            self.raised,
        )
