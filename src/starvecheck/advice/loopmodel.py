"""The worker model of a loop's timing: how many DataLoader workers, and what they
would gain, from a loop's wait, step and CPU figures (advice/workers.py's
`recommend_workers` is the entry point; advice/machinebound.py the bound by the
machine as measured).

The loop model. At num_workers=0 the training process makes each batch itself: it
waits W ms for a batch, of which C ms are CPU work (the rest waits on storage or
sleeps), then runs the step for R ms. With k workers:

- each batch is also handed over: the worker writes it into shared memory and sends
  it (Hw ms of its CPU), the training process receives, maps and first reads it (Hm
  ms). loop/handover.py measures both for the loop's batch size, however small (a
  batch's trip through the queues costs about a millisecond on each side here); for
  19 MB float image batches they cost about as much as the decode a worker saves;
- the workers deliver a batch every (W + Hw) / k ms, and no faster than the CPU
  allows: each step needs C + Hw of the workers' CPU and P ms of the training
  process's own (all its threads, measured where it can be), out of the CPUs the job
  can have: the effective CPUs E (affinity and cgroup quota, a fraction included) less
  what other processes took over the same seconds (the high side of their spread,
  each second's reading; their use first fills the machine's CPUs past E). The
  training process's CPUs are busy only in its step: while it waits they are the
  workers', so the step is at least (C + Hw + P) / (E - O), O taken as none where the
  others were not measured (a trace);
- the training process's own path is R + Hm, its CPU part (receiving the batch
  included) stretched where the workers, it and the other processes outnumber the CPUs
  ((k + 1 + O) / E), and each batch held back while another worker's interpreter is
  busy with its Python work (advice/loopbounds.py, `held`: the workers' batches cross
  one queue, and a busy sender's lock delays its batch and those behind it);

and the step is the slowest of the three. The count is the fewest within 5% of the best
predicted step, up to the count that hides the latency (one spare) and, for CPU work,
never more than the CPUs could keep busy. So:

- waiting on I/O (C small against W): more workers than cores help, up to W / R;
- CPU work (C close to W): never more workers than the CPUs, and when C / A > R no
  worker count keeps up: the loader is CPU-bound, and the fix is to do the work once,
  offline (pre-tokenize, pre-decode), not more workers;
- a step whose process keeps every CPU busy itself (torch's intra-op threads on a CPU
  step): a worker would take its CPU from the step, and none is recommended;
- big batches: the hand-over can be the limit; the fix is smaller batches (uint8,
  converted and normalised on the device).

A loop that already has k0 workers and still waits shows a step of S ms, which is
then the interval at which its workers deliver: each worker takes W = k0 * S to make a
batch, and C is the workers' own CPU time per batch (watch reads it from the worker
processes); the hand-over is inside those figures. Where the wait is nearly all the
loop's own CPU receiving the batch, the workers keep up and nothing changes; a count
changes only for a predicted gain of 5% or more. The speed-up is S over the predicted
step. With the CPUs unknown (a trace of another machine), W / R workers keep level,
one spare, and no forecast is made.

What bounds every prediction (docs/architecture.md, principle 9):
- the share of the step loading can save: the predicted step is never below R + Hm,
  so the speed-up never passes S / (S - wait + receiving);
- with k0 workers, a worker's time per batch stays k0 * S (its time waiting for a CPU
  included: a new worker gets no CPU of its own that today's lack), so k workers
  deliver at most k / k0 as fast;
- the CPU a step needs against the CPUs the job has; waiting for a CPU is CPU work.
Where the machine is too busy to tell, or the bound is wide, no figure (`reason` says
why; the callers name `loader --factory`) and no change unless all of it gains.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from starvecheck.advice.loopbounds import Model
from starvecheck.advice.machinebound import MIN_GAIN, pool_wide, spread, too_busy, too_wide

# CPU work is this share of the wait or more: the loader is doing CPU work.
CPU_WORK_SHARE = 0.5
# Below this share of a core, the training step's own CPU is left out of the count.
NEGLIGIBLE_SHARE = 0.1
# A step whose process keeps busy all the effective CPUs but this many: no worker gains.
CONTENDED_SLACK = 0.5
# A wait, less the training process's own CPU receiving the batch, under this share of
# the step: the workers keep up.
QUIET_SHARE = 0.05
# Waiting on I/O or sleep, a count may go past the CPUs, but no further than this many
# workers a CPU (at least IO_WORKERS_LEAST): each is a process with its own memory and
# open files, and past that the storage, not the count, sets the pace.
IO_WORKERS_PER_CPU = 8
IO_WORKERS_LEAST = 8


@dataclass(frozen=True)
class Loop:
    """A loop's timing (see the module docstring). With `workers_now` 0, the loop loads
    in its own process: `wait_ms` is the time it takes to make a batch and `wait_cpu_ms`
    the loading thread's CPU time in it. With workers, `wait_ms` is the loop's wait per
    step and `wait_cpu_ms` the workers' CPU time per batch. None (not measured) is taken
    as all CPU, the safe side. `step_cpu_ms`: CPU the training thread used in the rest
    of the step (`rest_ms`)."""

    wait_ms: float
    rest_ms: float
    wait_cpu_ms: float | None = None
    step_cpu_ms: float = 0.0
    workers_now: int = 0
    # The whole training process's CPU in the rest of the step (all its threads); None:
    # not measured (a trace), taken as the loop thread's.
    step_process_cpu_ms: float | None = None
    # What handing a batch from a worker costs, ms of CPU per batch on each side
    # (loop/handover.py); only used where the loop loads in its own process today.
    handover_worker_ms: float = 0.0
    handover_main_ms: float = 0.0
    batch_bytes: int | None = None
    # With workers: the loop thread's CPU inside its wait, receiving the batch.
    receive_cpu_ms: float = 0.0
    # Time runnable but waiting for a CPU (schedstat), per batch: with workers, the
    # workers'; at num_workers=0, the loading thread's. Another process held the CPU:
    # a batch made on a CPU of its own takes that much less, and none of it is I/O.
    runq_ms: float = 0.0
    # At num_workers=0: the CPU the whole training process spent making a batch (all
    # its threads; torch's intra-op pool runs the pipeline's tensor operations there,
    # where a worker runs them on one thread). None: not measured.
    process_cpu_ms: float | None = None
    # The machine as measured over the same seconds (attach: once a second; watch: about
    # once a second): the CPUs other processes kept busy, each reading (its spread bounds
    # the prediction); empty: not measured (a trace), taken as none, as before.
    others_cpus_each: Sequence[float] = ()
    # The whole training process's CPU outside its workers and outside the loading it
    # does itself (all its threads: the step, receiving batches, torch's pools), in CPUs
    # over those seconds; None: not measured (then the step's figures stand for it).
    process_cpus: float | None = None
    # The machine's online CPUs (others' use is counted against them, the quota against
    # the effective CPUs) and its 1-minute load average; None: not read.
    machine_cpus: float | None = None
    load_average: float | None = None


@dataclass(frozen=True)
class Forecast:
    """What the loop model predicts with the recommended workers."""

    step_ms: float  # the predicted step
    speedup: float  # today's step over the predicted one
    available_cpus: float  # A: CPU the workers can have
    cpu_bound: bool  # no worker count keeps up: the CPU needed exceeds the CPU there is
    cpu_work: bool  # the wait is mostly CPU work (not I/O or sleep)
    handover_ms: float = 0.0  # CPU per batch handing it over, both sides (0: none counted)
    # What bounds the predicted step: "own" (the training process's step and receiving
    # the batch), "workers" (their delivery), "cpus" (the CPU loading needs), or
    # "contended" (the step's own threads keep the CPUs busy: no worker gains).
    limit: str = "workers"
    receive_ms: float = 0.0  # of handover_ms, the training process's share
    # The later passes' restarts, ms a step, in both steps as they are now (more workers
    # do not shorten a pass's first batch): advice/stepworkers.py adds them.
    restart_ms: float = 0.0


@dataclass(frozen=True)
class WorkerAdvice:
    workers: int
    why: str  # the rule or the arithmetic, in words
    workers_now: int = 0
    forecast: Forecast | None = None  # a loop's, where its CPUs are known
    # Why no figure is given where the CPUs are known (the machine too busy for the model
    # to tell, or the bound too wide; see the module docstring). None: the forecast stands.
    reason: str | None = None

    @property
    def changes(self) -> bool:
        return self.workers != self.workers_now


def loop_advice(loop: Loop, effective_cpus: float | None) -> WorkerAdvice | None:
    """A loop's count and forecast (module docstring); None without a wait or a step.
    At num_workers=0 a worker's one thread costs between the loading thread's CPU and
    all the process's (machinebound.pool_wide): where the two forecasts part, none."""
    if loop.wait_ms <= 0 or loop.rest_ms <= 0:
        return None
    pooled = _advice(loop, effective_cpus, pooled=True)
    thread, process = loop.wait_cpu_ms, loop.process_cpu_ms
    if loop.workers_now or thread is None or process is None or pooled.forecast is None:
        return pooled
    alone = _advice(loop, effective_cpus, pooled=False)
    if alone.forecast is None:
        return pooled
    least = pooled.forecast.speedup
    wide = pool_wide(thread, process, least, alone.forecast.speedup)
    if wide is None:
        return pooled
    gains = pooled.changes and least >= MIN_GAIN  # the count gains at both ends
    return WorkerAdvice(pooled.workers if gains else 0, pooled.why, 0, None, wide)


def _advice(loop: Loop, effective_cpus: float | None, pooled: bool) -> WorkerAdvice:
    """The count and forecast, a batch made at num_workers=0 costing a worker the CPU
    all the training process's threads spent on it (`pooled`) or the loading thread's."""
    wait_ms, rest_ms, workers_now = loop.wait_ms, loop.rest_ms, loop.workers_now
    step_now = wait_ms + rest_ms
    # At num_workers=0 a worker would also hand each batch over (loop/handover.py);
    # with workers that is in the figures already (their CPU, the loop's receiving).
    hand_w, hand_m = max(0.0, loop.handover_worker_ms), max(0.0, loop.handover_main_ms)
    runq = max(0.0, loop.runq_ms)
    if workers_now > 0:
        hand_w, hand_m = 0.0, min(max(0.0, loop.receive_cpu_ms), wait_ms)
        if wait_ms - hand_m < QUIET_SHARE * step_now and effective_cpus is not None:
            return _keeping_up(loop, step_now, hand_m, effective_cpus)
        wait_ms = workers_now * step_now  # each worker takes k0 steps to make its batch
        # A new worker gets no CPU of its own that today's lack (their time waiting for
        # one stays), so k workers deliver at most k / k0 as fast: the (n+k)/n cap.
        own_ms = wait_ms
    else:
        # What making a batch takes on a CPU of its own: the time measured less the time
        # it waited for one, and where `pooled`, at least the CPU all the training
        # process's threads spent on it (one worker thread does it alone).
        own_ms = max(wait_ms - runq, 1e-3)
        if pooled and loop.process_cpu_ms is not None:
            own_ms = max(own_ms, loop.process_cpu_ms)
    made_ms = own_ms + hand_w  # a worker's time to make and send a batch
    main_cpu = min(max(loop.step_cpu_ms, 0.0), rest_ms)  # the loop thread's, in the step
    if effective_cpus is None:
        keep_up = math.ceil(made_ms / (rest_ms + hand_m))
        why = f"a batch takes {wait_ms:,.1f} ms to load and the rest of the step {rest_ms:,.1f} ms"
        return WorkerAdvice(max(1, workers_now, keep_up + 1), why, workers_now)
    wait_cpu = loop.wait_cpu_ms
    if pooled and not workers_now and wait_cpu is not None and loop.process_cpu_ms is not None:
        wait_cpu = max(wait_cpu, loop.process_cpu_ms)
    cpu_ms = own_ms if wait_cpu is None else min(max(wait_cpu, 0.0), own_ms)
    cpu_ms += hand_w
    # Time runnable but waiting for a CPU is CPU work the workers could not get, never
    # I/O or sleep (at num_workers=0 it is out of `own_ms` already).
    queued = min(runq, max(0.0, made_ms - cpu_ms)) if workers_now else 0.0
    f = _Figures(
        loop, effective_cpus, step_now, wait_ms, made_ms, cpu_ms, queued, hand_w, hand_m, main_cpu
    )
    others = spread(loop.others_cpus_each)
    if others is None:  # not measured: the machine taken as the training job's alone
        return f.advice(None)
    low, median, high = others
    machine, own = loop.machine_cpus or effective_cpus, f.own_cpus
    free = f.room(median) - own
    busy = too_busy(loop.load_average, machine, effective_cpus, median, own, free)
    if busy is not None:
        return _no_figure(workers_now, busy, others, f.why_cpus(median))
    bound, best = f.advice(high), f.advice(low)
    assert bound.forecast is not None and best.forecast is not None
    most, least = best.forecast.speedup, bound.forecast.speedup
    wide = too_wide(best.changes, bound.changes, most, least, low, high)
    if wide is not None:
        return _no_figure(workers_now, wide, others, bound.why)
    return bound


@dataclass(frozen=True)
class _Figures:
    """A loop's figures, ready for the model at any CPU use of the other processes."""

    loop: Loop
    effective: float  # E
    step_now: float
    wait_ms: float  # the time a batch takes today (k0 x the step with workers)
    made_ms: float  # W + Hw: a worker's time to make and send a batch
    cpu_ms: float  # C + Hw: its CPU
    queued: float  # of made_ms, time the workers waited for a CPU (CPU work)
    hand_w: float
    hand_m: float
    main_cpu: float  # the loop thread's CPU in the rest of the step

    @property
    def own_cpus(self) -> float:
        """P: the CPUs the training process keeps busy on its own path (its step and
        receiving batches), all its threads where measured; below a tenth of a CPU
        (a step that waits on the GPU) it is noise, left out."""
        rest = self.loop.rest_ms
        thread = self.main_cpu / rest
        if self.loop.process_cpus is not None:
            process = self.loop.process_cpus * self.step_now / (rest + self.hand_m)
        else:
            process = (self.loop.step_process_cpu_ms or 0.0) / rest
        p = min(max(thread, process), self.effective)
        return p if p >= NEGLIGIBLE_SHARE else 0.0

    def room(self, others: float | None) -> float:
        """The CPUs the training job can have: the effective CPUs, less what other
        processes took of them (their use first fills the machine's CPUs past the
        effective ones: a quota on a large host)."""
        if others is None:
            return self.effective
        machine = max(self.loop.machine_cpus or self.effective, self.effective)
        return max(0.0, min(self.effective, machine - others))

    def why_cpus(self, others: float | None) -> str:
        p = self.own_cpus
        text = (
            f"{max(0.0, self.room(others) - p):.1f} CPU(s) are free for workers "
            f"({self.effective:.1f} effective"
        )
        if p >= 0.05:
            text += f", less {p:.1f} the training process uses in its step"
        taken = self.effective - self.room(others)
        if others is not None and taken >= 0.05:
            text += f", less {taken:.1f} other processes took"
        return text + ")"

    def advice(self, others: float | None) -> WorkerAdvice:
        """The count and forecast with other processes keeping `others` CPUs busy."""
        loop, effective, step_now = self.loop, self.effective, self.step_now
        workers_now, rest_ms = loop.workers_now, loop.rest_ms
        cpu_work = self.cpu_ms + self.queued >= CPU_WORK_SHARE * self.made_ms
        # The CPUs the whole training process keeps busy in its step (torch's threads
        # too): where that is all of them, a worker takes its CPU from the step's own.
        process = loop.step_process_cpu_ms
        step_cpus = max(self.main_cpu, process if process is not None else 0.0) / rest_ms
        contended = step_cpus >= max(1.0, effective - CONTENDED_SLACK)
        m = Model(rest_ms, self.main_cpu, self.hand_m, self.made_ms, self.cpu_ms, effective,
                   self.room(others), self.own_cpus * (rest_ms + self.hand_m))  # fmt: skip
        keep_up = math.ceil(self.made_ms / (rest_ms + self.hand_m))  # hides the latency
        # CPU work (time waiting for a CPU included): never more workers than the CPUs
        # could keep busy (past them, the CPU, not the count, limits the batches);
        # waiting on I/O or sleep may go past them.
        work = self.cpu_ms + self.queued
        cpu_cap = (
            max(1, math.floor(min(effective * self.made_ms / work, 1e6))) if work > 0 else 10**6
        )
        io_cap = max(IO_WORKERS_LEAST, math.ceil(IO_WORKERS_PER_CPU * effective))
        most = max(1, workers_now, min(keep_up + 1, cpu_cap, io_cap))  # one spare
        workers = workers_now if contended else m.choose(workers_now, most, step_now)
        predicted = m.step(workers) if workers else step_now
        at = m.bounds(max(1, workers))
        limit = "contended" if contended else max(at, key=lambda b: at[b])
        cpu_bound = contended or m.loading_cpu_bound()
        speedup = max(1.0, step_now / predicted)
        available = m.workers_cpus(predicted)  # on average, at the predicted pace
        why = _why(loop, m, self.wait_ms, step_now, self.hand_w)
        if keep_up + 1 > io_cap and cpu_cap > io_cap and not contended:
            why += _io_capped(keep_up + 1, io_cap)
        if contended:
            why += (
                f", in which the training process keeps {step_cpus:.1f} of the "
                f"{effective:.1f} effective CPU(s) busy itself (its own threads), so a "
                "worker would take its CPU from the step"
            )
        else:
            why += "; " + self.why_cpus(others)
        forecast = Forecast(predicted, speedup, available, cpu_bound, cpu_work,
                            self.hand_w + self.hand_m, limit, self.hand_m)  # fmt: skip
        return WorkerAdvice(max(workers, workers_now), why, workers_now, forecast)


def _no_figure(
    workers_now: int, reason: str, spread: tuple[float, float, float], why: str
) -> WorkerAdvice:
    low, median, high = spread
    text = (
        f"{why}; other processes kept {median:.1f} CPU(s) busy ({low:.1f}-{high:.1f} each second)"
    )
    return WorkerAdvice(workers_now, text, workers_now, None, reason)


def _io_capped(wanted: int, cap: int) -> str:
    return (
        f"; {wanted} workers would hide the wait, but no more than {cap} "
        f"({IO_WORKERS_PER_CPU} a CPU) are recommended: past them the storage sets the pace"
    )


def _why(loop: Loop, m: Model, wait_ms: float, step_now: float, hand_w: float) -> str:
    """The arithmetic of a loop's advice, in words."""
    k0 = loop.workers_now
    made = (
        f"each of the {k0} worker(s) takes {wait_ms:,.1f} ms to make a batch "
        f"({k0} x the {step_now:,.1f} ms step)"
        if k0
        else f"a batch takes {wait_ms:,.1f} ms to make in the training process"
    )
    waited = min(max(0.0, loop.runq_ms), wait_ms)
    if waited >= 0.05 * wait_ms:
        made += f", {waited:,.1f} ms of it waiting for a CPU another process held"
    why = f"{made}; {m.cpu_ms - hand_w:,.1f} ms of CPU work"
    own = max(wait_ms - waited, 1e-9)
    threads = (loop.process_cpu_ms or 0.0) / own
    if not k0 and threads > 1.2:
        why += (
            f" (the training process's threads together, {threads:.1f} of them busy; a "
            "worker does it on one)"
        )
    size = f" of {loop.batch_bytes / 1e6:,.1f} MB" if loop.batch_bytes else ""
    if not k0 and (hand_w or m.hand_m):
        why += (
            f"; handing each batch{size} over from a worker costs {hand_w:,.1f} ms of CPU "
            f"there and {m.hand_m:,.1f} ms in the training process (measured)"
        )
    elif m.hand_m >= 0.05:
        why += f"; receiving each batch{size} takes {m.hand_m:,.1f} ms of the loop's CPU"
    return why + f"; the rest of the step takes {loop.rest_ms:,.1f} ms"


def _keeping_up(loop: Loop, step_now: float, receive: float, effective: float) -> WorkerAdvice:
    """Workers that keep up: the loop's wait is its own CPU receiving each batch."""
    k = loop.workers_now
    why = (
        f"of the {loop.wait_ms:,.1f} ms the loop waits for each batch, {receive:,.1f} ms are "
        f"its own CPU receiving it from the {k} worker(s)"
    )
    if loop.batch_bytes:
        why += f" ({loop.batch_bytes / 1e6:,.1f} MB a batch)"
    forecast = Forecast(step_now, 1.0, effective, False, True, receive, "own", receive)
    return WorkerAdvice(k, why, k, forecast)
