"""num_workers advice from a step breakdown: a trace read by `profile --trace`, or a
loop as `starvecheck.watch` timed it (advice/trace judges both).

watch measures the CPUs of its machine and the loading's CPU time, so its loop gets
one count from the worker model (advice/workers.py) and a predicted speed-up. A trace
has neither: it cannot tell whether loading is CPU work or waits on storage, nor how
many CPUs the machine it was taken on has, so where the count the waits call for is
more than a couple of workers it gives both answers, and how to tell which applies.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from starvecheck.advice.workers import (
    MEASURED_PATH,
    Cpus,
    Loop,
    WorkerAdvice,
    recommend_workers,
)
from starvecheck.core.model import Gain, GainKind
from starvecheck.core.paired import Comparison, compare
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.steps import Parameters, Step, StepFigures

HANDOVER_SHARE = 0.2  # hand-over CPU per batch worth saying, as a share of the predicted step
SINGLE_PROCESS = "_SingleProcessDataLoaderIter"
# The change as the finding's `fix` states it: num_workers, and nothing it does not set.
LOADER_LINE = "`DataLoader(..., num_workers={n})`"
# Up to this many workers a trace gives one count: two CPU cores per training process
# are the common case, where CPU work and I/O waits call for the same count.
ONE_COUNT = 2
# How to tell CPU work from I/O waits, on the user's own loop or pipeline.
WHICH = (
    "`for batch in starvecheck.watch(loader):` in your loop measures the loading's CPU "
    "time and gives one count; `starvecheck loader --factory FILE.py:FUNC` measures your "
    "own pipeline at each num_workers"
)
EITHER = (
    "N no more than the CPU cores per training process where loading is CPU work "
    "(decode, tokenize, augment), more where it waits on storage or the network (I/O)"
)
SLOW_LINK = (
    "`starvecheck starve` (CPU preprocessing per sample) and `starvecheck io` (storage, "
    "cold cache) find the slow link"
)


def workers_needed(wait_ms: float, step_ms: float) -> int | None:
    """num_workers that keep up with a loop that now loads in its own process, on CPUs
    unknown (advice.workers: W / R workers keep level, one spare)."""
    advice = recommend_workers(Loop(wait_ms, step_ms - wait_ms), Cpus(None))
    return advice.workers if advice is not None else None


def single_process(n: int | None, wait_ms: float | None, step_ms: float | None) -> str:
    """What to change for a traced loop that loads in its own process, `n` workers
    keeping up (`workers_needed`): as many if loading waits on I/O, past the cores if
    need be; for CPU work, no more than the cores. Both said, where they can differ."""
    head = "The DataLoader loads in the training process (num_workers=0): load in worker processes"
    if n is None or wait_ms is None or step_ms is None:
        return f"{head}, {LOADER_LINE.format(n='N')}, {EITHER}. To tell which: {WHICH}."
    rest = step_ms - wait_ms
    level = (
        f"a batch takes {wait_ms:,.1f} ms to load and the rest of the step {rest:,.1f} ms, "
        f"so {wait_ms / rest:.1f} workers keep level"
    )
    if n <= ONE_COUNT:
        return (
            f"{head}, {LOADER_LINE.format(n=n)}: {level}; one spare. `starvecheck loader` "
            "measures each num_workers on your storage; if more workers do not close the "
            f"gap, {SLOW_LINK}."
        )
    return (
        f"{head}: {level}. A trace shows neither whether that loading is CPU work or "
        "waits, nor how many CPUs its machine has, so: if it waits on storage or the "
        f"network (I/O), {LOADER_LINE.format(n=n)} keeps up (one spare), even past the CPU "
        "cores; if it is CPU work (decode, tokenize, augment), no more workers than the CPU "
        "cores per training process on that machine, and past them the fix is to do the "
        "work once, offline (pre-tokenize or pre-decode into shards), or to make it "
        f"cheaper. To tell which: {WHICH}."
    )


@dataclass(frozen=True)
class Restarts:
    """What workers cost the passes after the first (the stage split's figures):
    `start_each_ms`, each worker's own start, ms a step (advice/loadstages.start_each_ms);
    `pass_steps`, a later pass's mean steps (None: no later pass was split)."""

    start_each_ms: float = 0.0
    pass_steps: float | None = None


def measured_advice(
    m: StepFigures,
    params: Parameters,
    wait_ms: float | None,
    step_ms: float | None,
    restarts: Restarts = Restarts(),
) -> WorkerAdvice | None:
    """The worker count for a loop whose machine CPUs and loading CPU time are known
    (watch measures both): the loading thread's at num_workers=0, the worker
    processes' with workers; the later passes' restarts kept (`restarts_kept`)."""
    cpus = params.effective_cpus
    if not cpus or wait_ms is None or step_ms is None:
        return None
    step_cpu = m.value_of(Step.COMPUTE_CPU_MS)
    measured = {
        "step_process_cpu_ms": m.value_of(Step.COMPUTE_PROCESS_CPU_MS),
        "handover_worker_ms": m.value_of(Step.HANDOVER_WORKER_CPU_MS) or 0.0,
        "handover_main_ms": m.value_of(Step.HANDOVER_MAIN_MS) or 0.0,
        "batch_bytes": _int(m.value_of(Step.BATCH_BYTES)),
        **_machine(m, params, step_ms),
    }
    if params.dataloader == SINGLE_PROCESS:
        wait_cpu = m.value_of(Step.DATA_WAIT_CPU_MS)
        runq = m.value_of(Step.DATA_WAIT_RUNQUEUE_MS) or 0.0
        measured |= {
            "runq_ms": runq,
            "process_cpu_ms": m.value_of(Step.DATA_WAIT_PROCESS_CPU_MS),
        }
        loop = Loop(wait_ms, step_ms - wait_ms, wait_cpu, step_cpu or 0.0, 0, **measured)
        # Workers would start again every later pass and wait for one's whole first
        # batch (at least the batch made here): none of that is in the loop now.
        first = wait_ms / restarts.pass_steps if restarts.pass_steps else 0.0
        advice = recommend_workers(loop, Cpus(float(cpus)))
        return restarts_kept(advice, 0.0, first, max(0.0, restarts.start_each_ms))
    workers, worker_cpu = params.num_workers, m.value_of(Step.WORKER_CPU_MS)
    if not isinstance(workers, int) or workers < 1 or worker_cpu is None:
        return None
    receive = m.value_of(Step.DATA_WAIT_CPU_MS) or 0.0
    measured |= {
        "receive_cpu_ms": receive,
        "handover_worker_ms": 0.0,
        "handover_main_ms": 0.0,
        "runq_ms": m.value_of(Step.WORKER_RUNQUEUE_MS) or 0.0,
    }
    # The model is of the steady state: the later passes' restarts, which more workers
    # do not shorten, out of the wait it reads and back in both steps.
    restart = min(max(m.value_of(Step.RESTART_WAIT_MS) or 0.0, 0.0), wait_ms)
    rest = step_ms - wait_ms
    loop = Loop(wait_ms - restart, rest, worker_cpu, step_cpu or 0.0, workers, **measured)
    added = max(0.0, restarts.start_each_ms)
    return restarts_kept(recommend_workers(loop, Cpus(float(cpus))), restart, 0.0, added)


def restarts_kept(
    a: WorkerAdvice | None, restart_ms: float, first_ms: float = 0.0, start_each_ms: float = 0.0
) -> WorkerAdvice | None:
    """The steady state's forecast with the later passes' restarts in both steps: now
    `restart_ms` a step (measured), and with the count advised that, `start_each_ms`
    more for each worker added (a pass's workers start one after another), and, where
    none loads in workers now, `first_ms` (each later pass's first batch, made by one
    worker). Each later pass's first batch takes one worker's whole batch whatever the
    count: on Lightning, 3 epochs of 60 steps, a prediction of the steady state alone ran
    +19%; 3 epochs of 40 from num_workers=0, +12%."""
    f = a.forecast if a is not None else None
    if a is None or f is None or not a.workers:
        return a
    first = max(0.0, first_ms) if not a.workers_now else 0.0
    after = restart_ms + first + max(0, a.workers - a.workers_now) * max(0.0, start_each_ms)
    if restart_ms <= 0 and after <= 0:
        return a
    now, step = f.step_ms * f.speedup + restart_ms, f.step_ms + after
    return replace(a, forecast=replace(f, step_ms=step, speedup=now / step, restart_ms=after))


def _machine(m: StepFigures, params: Parameters, step_ms: float) -> dict[str, Any]:
    """The machine as watch read it, for the worker model's bound: the other processes'
    CPUs each second, the training process's own CPU (all its threads: in its step, and
    with workers in its wait, receiving; at num_workers=0 its wait is the loading, which
    workers would take over), the machine's CPUs and load average. Ranks sharing a host
    are left as before: each is given its share of the CPUs, and the others read beside
    it include the other ranks, which that share counts already."""
    sharing = params.ranks_on_host
    if isinstance(sharing, int) and sharing > 1:
        return {}
    each = m.figure(Step.OTHERS_CPUS_EACH_S)
    step_pcpu = m.value_of(Step.COMPUTE_PROCESS_CPU_MS)
    wait_pcpu = m.value_of(Step.DATA_WAIT_PROCESS_CPU_MS) or 0.0
    own = None
    if step_pcpu is not None and step_ms > 0:
        in_wait = 0.0 if params.dataloader == SINGLE_PROCESS else wait_pcpu
        own = (step_pcpu + in_wait) / step_ms
    return {
        "others_cpus_each": tuple(each.values) if each is not None else (),
        "process_cpus": own,
        "machine_cpus": params.machine_cpus,
        "load_average": params.load_average,
    }


# The loop's steps in this many blocks: the model predicts each block's speed-up, and
# their spread is the prediction's interval (core/paired.py), as rounds are a sweep's.
BLOCKS = 5
# Per-step figures the model reads, averaged per block.
_PER_STEP = (
    Step.STEP_MS,
    Step.DATA_WAIT_MS,
    Step.DATA_WAIT_CPU_MS,
    Step.DATA_WAIT_RUNQUEUE_MS,
    Step.DATA_WAIT_PROCESS_CPU_MS,
    Step.COMPUTE_CPU_MS,
    Step.COMPUTE_PROCESS_CPU_MS,
)


def prediction_interval(
    m: StepFigures, params: Parameters, restarts: Restarts = Restarts()
) -> Comparison | None:
    """The predicted speed-up, block by block of steps: the loop's steps cut into
    BLOCKS runs of consecutive steps, the model fed each block's means; None with too
    few steps for two blocks. A change is recommended only where this interval clears
    no-change by the margin, the rule a sweep's rounds obey. `m`: the headline's
    figures (StepFigures.headline())."""
    per_step = {q: x for q in _PER_STEP if (x := m.figure(q)) is not None and x.values}
    step, wait = per_step.get(Step.STEP_MS), per_step.get(Step.DATA_WAIT_MS)
    if step is None or wait is None or len(step.values) != len(wait.values):
        return None
    n = len(step.values)
    blocks = min(BLOCKS, n // 2)
    if blocks < 2:
        return None
    speedups = []
    for b in range(blocks):
        lo, hi = b * n // blocks, (b + 1) * n // blocks
        block = m
        for q, x in per_step.items():
            mean = Figure.single(statistics.fmean(x.values[lo:hi])) if len(x.values) == n else None
            block = block.replaced(q, mean)
        wait_ms, step_ms = block.value_of(Step.DATA_WAIT_MS), block.value_of(Step.STEP_MS)
        advice = measured_advice(block, params, wait_ms, step_ms, restarts)
        if advice is None or advice.forecast is None:
            return None
        speedups.append(advice.forecast.speedup)
    return compare(speedups, [1.0] * len(speedups))


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


def offline(cpu_work: bool = True) -> str:
    """What is left where no worker count keeps up, in words (lower case, no stop):
    the work done once, offline, or made cheaper, or more CPUs per GPU."""
    work = "CPU work" if cpu_work else "work"
    return (
        f"do the {work} once, offline (pre-tokenize or pre-decode into shards), make it "
        "cheaper, or train on a node with more CPUs per GPU"
    )


def no_figure(a: WorkerAdvice, now: str) -> tuple[str, Gain, dict[str, Any]]:
    """The worker model's answer where it gives no figure (`a.reason`: the machine too
    busy for it to tell, or its bound too wide): no change, and the measured path; or,
    where every end of the bound gains with one count, that count without a figure."""
    if a.changes:  # both ends of a wide bound gain, with the same count
        text = (
            f"Load in worker processes, {LOADER_LINE.format(n=a.workers)}: {a.why}; that "
            f"count gains at both ends of what the model can tell, but not by how much "
            f"({a.reason}). {MEASURED_PATH} measures each count on the pipeline."
        )
        gain = Gain(GainKind.THROUGHPUT, None, f"no figure: {a.reason}")
        return text, gain, {"num_workers": a.workers}
    busy = "too wide" not in (a.reason or "")
    head = (
        "The machine is too busy for a model to tell what more workers would gain"
        if busy
        else "The model cannot tell what more workers would gain here"
    )
    text = (
        f"{head} ({a.reason}), so no worker count is advised ({now} stays): "
        f"{MEASURED_PATH} measures each count on the pipeline instead, best while the "
        "machine is as busy as it is in training."
    )
    return text, Gain(GainKind.THROUGHPUT, None, f"no figure: {a.reason}"), {}


def worker_change(
    a: WorkerAdvice, interval: Comparison | None = None
) -> tuple[str, Gain, dict[str, Any]]:
    """What to change, from the measured worker advice: the recommendation, the
    predicted speed-up (with its interval over blocks of steps, where there is one),
    the setting as data; where the model gives no figure, what to measure instead."""
    if a.reason is not None:
        return no_figure(a, f"num_workers={a.workers_now}")
    f = a.forecast
    assert f is not None  # a loop's advice on known CPUs
    line = LOADER_LINE.format(n=a.workers)
    now = f"num_workers={a.workers_now}"
    fix = offline(f.cpu_work)
    offline_fix = (
        f"{fix[0].upper()}{fix[1:]}. `starvecheck starve` measures CPU per sample against "
        "your step."
    )
    handover = ""
    if f.handover_ms >= HANDOVER_SHARE * f.step_ms:
        handover = (
            f" Handing batches over between processes costs {f.handover_ms:,.1f} ms a batch "
            f"here ({f.receive_ms:,.1f} ms of it in the training process), which workers add "
            "rather than save: make the batches smaller "
            "(uint8 images, 4x fewer bytes than float32; int32 token ids) and convert and "
            "normalise on the device (`x.to(device, non_blocking=True).float().div_(255)`)."
        )
    if not a.changes:
        if f.limit == "own":
            recommendation = (
                f"At {now} the workers keep up: {a.why}. What is left is the training "
                "process itself, receiving each batch and running its step, so more "
                f"workers do not shorten it.{handover}"
            )
        else:
            recommendation = (
                f"Loading is CPU-bound at {now}: {a.why}, so more workers only compete for "
                f"the same CPUs. {offline_fix}{handover}"
            )
        gain = Gain(GainKind.STEP_SHARE, None, "no worker count gains here")
        return recommendation, gain, {}
    if f.cpu_bound:
        recommendation = (
            f"Loading is CPU-bound: {a.why}, so even {f.available_cpus:.1f} busy CPU(s) deliver "
            f"a batch no faster than every {f.step_ms:,.1f} ms. {line} gets that far; past it, "
            f"more workers only compete for the same CPUs. {offline_fix}{handover}"
        )
    else:
        where = (
            "The DataLoader loads in the training process (num_workers=0): load in worker processes"
            if not a.workers_now
            else f"{now} cannot keep up: load in more worker processes"
        )
        recommendation = (
            f"{where}, {line}: {a.why}, so {a.workers} worker(s) keep up"
            + (
                " (the wait is mostly I/O or sleep, so workers may outnumber the CPUs)"
                if not f.cpu_work
                else ""
            )
            + ". `starvecheck loader` measures each num_workers on your storage."
            + handover
        )
    spread = (
        ""
        if interval is None
        else f"; over {interval.rounds} blocks of steps {interval.low:.2f}x-{interval.high:.2f}x"
    )
    restarts = (
        f"; the later passes' restarts, {f.restart_ms:,.1f} ms a step with them (a pass's "
        "first batch, made by one worker, and its workers' start: more shorten neither)"
        if f.restart_ms
        else ""
    )
    basis = (
        f"predicted: the mean step from {f.step_ms * f.speedup:,.1f} ms to {f.step_ms:,.1f} ms "
        f"with num_workers={a.workers} ({f.available_cpus:.1f} CPU(s) for workers)"
    )
    gain = Gain(GainKind.THROUGHPUT, round(f.speedup, 3), basis + restarts + spread)
    return recommendation, gain, {"num_workers": a.workers}
