"""Judging `attach PID`: a running job, read from its sampled stacks and /proc.

- `attach.data-wait`: the share of the main thread's samples inside the DataLoader's
  iteration, at the thresholds every command uses (advice/profile.severity: above 5%
  input-bound, above 20% highly); the rank that waits most where several were read.
- `attach.loader-bound`: with a wait worth a finding, what the loading is bound by and
  the change. At num_workers=0 (no worker found) the main thread's own loading samples
  say what it does; with workers: hand-over where the main thread spends most of its
  wait receiving batches; CPU where the workers are on a CPU or waiting for one most of
  the time they are alive; I/O where they are blocked (neither) or in readers most of
  it. The count and its predicted gain come from the worker model `watch` uses
  (advice/workers.py), fed per second of the main thread: attach cannot count steps,
  and the model's speed-up is the same in any unit of time. At num_workers=0 the
  loading's CPU is the share of its samples not in readers, and the hand-over a worker
  would add is not measured (taken as none: for large batches the gain is an upper
  bound, and the finding says so).
- `attach.straggler`: several ranks, one waiting for data 10 points more than the
  median of the others: the others wait for it at every collective.
- `attach.throttled`: the cgroup throttled the job in 5% of its periods or more.
- `attach.worker-memory`: a worker's USS grew 64 MiB or more over the seconds read.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from starvecheck.advice.profile import severity
from starvecheck.advice.stepworkers import LOADER_LINE, no_figure, offline
from starvecheck.advice.workers import Cpus, Loop, WorkerAdvice, recommend_workers
from starvecheck.core.metric import Metric, one, select, value
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

STRAGGLER_POINTS = 0.10
THROTTLED_SHARE = 0.05
WORKER_GROWTH_BYTES = 64 << 20
BOUND_SHARE = 0.5  # a link named as the bound from half the time on
MIB = 1 << 20


def rules(results: Results) -> list[Finding]:
    r = results.get("attach")
    if r is None:
        return []
    out: list[Finding] = []
    ranks = _ranks(r)
    waits = {pid: w for pid in ranks if (w := _share(r, pid, "main_share", "data")) is not None}
    if waits:
        pid = max(waits, key=lambda p: waits[p])
        out.append(_data_wait(r, pid, waits))
        if severity(waits[pid]) is not Severity.OK:
            bound = _bound(r, pid, waits[pid])
            if bound is not None:
                out.append(bound)
        straggler = _straggler(r, waits)
        if straggler is not None:
            out.append(straggler)
    out += [f for f in (_throttled(r), _worker_memory(r, ranks)) if f is not None]
    return out


def _ranks(r: StageResult) -> list[int]:
    return [int(x["pid"]) for x in r.parameters.ranks if isinstance(x, dict) and "pid" in x]


def _who(r: StageResult, pid: int) -> str:
    for x in r.parameters.ranks:
        if isinstance(x, dict) and x.get("pid") == pid:
            rank = x.get("rank")
            return f"PID {pid}" + (f" (rank {rank})" if rank is not None else "")
    return f"PID {pid}"


def _of(r: StageResult, pid: int) -> Sequence[Metric]:
    return select(r.metrics, pid=pid)


def _share(r: StageResult, pid: int, quantity: str, kind: str) -> float | None:
    if value(_of(r, pid), quantity="samples") is None:
        return None
    return value(_of(r, pid), quantity=quantity, kind=kind) or 0.0


def _breakdown(r: StageResult, pid: int, quantity: str, kinds: Sequence[str]) -> str:
    parts = [
        f"{k} {v:.0%}"
        for k in kinds
        if (v := value(_of(r, pid), quantity=quantity, kind=k)) is not None and v >= 0.005
    ]
    return ", ".join(parts)


MAIN_KINDS = ("data", "step", "copy", "gpu-wait", "collective", "other")
LOAD_KINDS = ("read", "decode", "tokenize", "collate", "handover", "idle", "other")


def _data_wait(r: StageResult, pid: int, waits: dict[int, float]) -> Finding:
    share = waits[pid]
    sev = severity(share)
    m = _of(r, pid)
    n = int(value(m, quantity="samples") or 0)
    seconds = r.parameters.seconds or 0.0
    evidence = f"{_who(r, pid)}: {n} samples of its main thread over {seconds:g} s: " + _breakdown(
        r, pid, "main_share", MAIN_KINDS
    )
    other = r.parameters.other_frames.get(str(pid))
    if other:
        evidence += f" (other: {other})"
    gpus = _gpus(r)
    if gpus:
        evidence += f"; {gpus}"
    if len(waits) > 1:
        evidence += "; every rank's wait: " + ", ".join(
            f"{_who(r, p)} {w:.0%}" for p, w in sorted(waits.items())
        )
    if sev is Severity.OK:
        title = f"{_who(r, pid)} waits for data {share:.0%} of the time: its data keeps up"
        return Finding("attach.data-wait", sev, title, evidence)
    kind = "highly input-bound" if sev is Severity.CRITICAL else "input-bound"
    title = f"{_who(r, pid)} waits for data {share:.0%} of the time: {kind}"
    return Finding("attach.data-wait", sev, title, evidence, "See attach.loader-bound for why.")


def _gpus(r: StageResult) -> str:
    """The job's GPUs' utilization over the seconds read (NVML, once a second)."""
    parts = [
        f"GPU {m.labels.get('gpu')} {m.value:.0f}% ({m.min:.0f}-{m.max:.0f}%)"
        for m in select(r.metrics, quantity="gpu_utilization")
        if m.value is not None and m.min is not None and m.max is not None
    ]
    return ("busy by NVML, median each second (range): " + ", ".join(parts)) if parts else ""


def _bound(r: StageResult, pid: int, share: float) -> Finding | None:
    m = _of(r, pid)
    workers = int(value(m, quantity="workers_found") or 0)
    loading = _breakdown(r, pid, "main_loading_share", LOAD_KINDS)
    cpus = float(r.parameters.effective_cpus or 1)
    if workers == 0:
        reading = value(m, quantity="main_loading_share", kind="read") or 0.0
        cpu_ms = max(0.0, share - reading) * 1e3
        machine = _machine(r, m, cpu_ms / 1e3)
        step_cpu = _step_cpu_ms(m, share, cpu_ms / 1e3)
        loop = Loop(share * 1e3, (1 - share) * 1e3, cpu_ms, step_cpu, 0, **machine)
        what = f"The main thread loads its own batches (no DataLoader worker found): {loading}"
        assumed = (
            " Assumed: handing batches over from workers is not measured here (taken as "
            "none); for large batches the gain is an upper bound."
        )
        return _advise(r, pid, loop, cpus, "loads in the training process", what, assumed)
    wcpu = value(m, quantity="workers_cpus") or 0.0
    runq = value(m, quantity="workers_runq_cpus") or 0.0
    blocked = value(m, quantity="workers_blocked_share")
    kinds = _breakdown(r, pid, "worker_share", LOAD_KINDS)
    receive = _receive_cpu(m, share)
    busy = (wcpu + runq) / workers
    if receive >= BOUND_SHARE * share:
        link = "hand-over-bound"
    elif busy >= 1 - BOUND_SHARE / 2 or wcpu + runq >= 0.8 * cpus:
        link = "CPU-bound"
    elif blocked is not None and blocked >= BOUND_SHARE:
        link = "I/O-bound"
    else:
        link = "bound by neither CPU nor I/O that was seen"
    what = (
        f"{workers} DataLoader worker(s): {wcpu:.2f} CPUs busy and {runq:.2f} waiting for a "
        f"CPU (of {cpus:g} effective), "
        + (f"blocked {blocked:.0%} of the time they were alive; " if blocked is not None else "")
        + f"their samples: {kinds or 'none'}; the main thread's wait: {loading}"
    )
    loop = Loop(
        share * 1e3,
        (1 - share) * 1e3,
        wcpu * 1e3,
        _step_cpu_ms(m, share, receive),
        workers,
        receive_cpu_ms=receive * 1e3,
        runq_ms=runq * 1e3,
        **_machine(r, m, 0.0),
    )
    return _advise(r, pid, loop, cpus, f"its workers are {link}", what, "")


def _receive_cpu(m: Sequence[Metric], share: float) -> float:
    """The main thread's CPU spent receiving batches, as a share of its time: its
    samples in the hand-over, but no more than the CPU it used beyond the rest of its
    loop. A thread caught in the hand-over while the workers it waits on get no CPU
    (an fd passed by a worker's thread that cannot run) is waiting, not working."""
    sampled = value(m, quantity="main_loading_share", kind="handover") or 0.0
    thread = value(m, quantity="main_thread_cpus")
    if thread is None:
        return sampled
    return min(sampled, max(0.0, thread - (1.0 - share)))


def _step_cpu_ms(m: Sequence[Metric], share: float, in_wait: float) -> float:
    """The main thread's CPU outside its wait, per second: its CPU less what it spent
    inside the wait (`in_wait`: loading at num_workers=0, receiving batches with
    workers), at most the time outside the wait. (Taking the whole wait as CPU, as
    before, read a thread blocked in its wait as idle in its step: a CPU-bound step
    left every CPU free for workers.)"""
    thread = value(m, quantity="main_thread_cpus") or 0.0
    return min(max(0.0, thread - in_wait), 1.0 - share) * 1e3


def _machine(r: StageResult, m: Sequence[Metric], loading: float) -> dict[str, Any]:
    """The machine over the seconds read, for the worker model's bound: the other
    processes' CPUs each second (the whole window's figure where those are missing),
    the training process's own CPU less the loading it does itself (`loading`, CPUs),
    the machine's CPUs and load average."""
    each = one(r.metrics, quantity="others_cpus_each_s")
    whole = value(r.metrics, quantity="others_cpus")
    others = tuple(each.values) if each is not None and each.values else ()
    if not others and whole is not None:
        others = (whole,)
    main = value(m, quantity="main_cpus")
    return {
        "others_cpus_each": others,
        "process_cpus": None if main is None else max(0.0, main - loading),
        "machine_cpus": value(r.metrics, quantity="machine_cpus"),
        "load_average": value(r.metrics, quantity="load_average"),
    }


def _advise(
    r: StageResult, pid: int, loop: Loop, cpus: float, link: str, what: str, assumed: str
) -> Finding | None:
    advice = recommend_workers(loop, Cpus(cpus))
    title = f"{_who(r, pid)}: {link}"
    if advice is not None and advice.reason is not None:
        text, gain, _ = no_figure(advice, f"num_workers={advice.workers_now}")
        return Finding("attach.loader-bound", Severity.INFO, title, what, text, gain)
    if advice is None or advice.forecast is None:
        return Finding("attach.loader-bound", Severity.INFO, title, what)
    recommendation, gain, fix = _change(advice, cpus)
    sev = Severity.WARNING if advice.changes else Severity.INFO
    return Finding("attach.loader-bound", sev, title, what, recommendation + assumed, gain, fix=fix)


def _change(a: WorkerAdvice, cpus: float) -> tuple[str, Gain, dict[str, int]]:
    """The worker model's answer in attach's words: shares of time, never a step's
    milliseconds (attach counts no steps)."""
    f = a.forecast
    assert f is not None
    now = f"num_workers={a.workers_now}"
    if not a.changes:
        if f.limit == "own":
            text = (
                f"At {now} the workers keep up: what is left is the training process itself "
                "(receiving batches, its step), which more workers do not shorten."
            )
        else:
            text = (
                f"No worker count gains here: loading is CPU-bound at {now}, with "
                f"{f.available_cpus:.1f} of {cpus:g} CPU(s) free for workers; {offline()}."
            )
        return text, Gain(GainKind.THROUGHPUT, None, "no worker count gains here"), {}
    text = f"{LOADER_LINE.format(n=a.workers)} ({now} now): the worker model predicts the loop "
    text += f"takes batches {f.speedup:.2f}x as fast"
    if not f.cpu_work:
        text += " (the loading waits on I/O or sleep, so workers may outnumber the CPUs)"
    if f.cpu_bound:
        text += (
            f"; that far and no further: {f.available_cpus:.1f} of {cpus:g} CPU(s) are free "
            f"for workers and the loading is CPU work, so more only compete for them; {offline()}"
        )
    text += ". `starvecheck loader --factory FILE.py:FUNC` measures each count on your pipeline."
    basis = (
        f"predicted by the worker model from the shares measured: the loop's time per batch "
        f"{1 / f.speedup:.0%} of today's with num_workers={a.workers} "
        f"({f.available_cpus:.1f} CPU(s) for workers)"
    )
    return text, Gain(GainKind.THROUGHPUT, round(f.speedup, 3), basis), {"num_workers": a.workers}


def _straggler(r: StageResult, waits: dict[int, float]) -> Finding | None:
    if len(waits) < 2:
        return None
    pid = max(waits, key=lambda p: waits[p])
    rest = statistics.median(w for p, w in waits.items() if p != pid)
    if waits[pid] - rest < STRAGGLER_POINTS:
        return None
    return Finding(
        "attach.straggler",
        Severity.WARNING,
        f"{_who(r, pid)} is the straggler: it waits for data {waits[pid]:.0%} of the time, "
        f"the other ranks {rest:.0%} (median)",
        ", ".join(f"{_who(r, p)}: {w:.0%}" for p, w in sorted(waits.items())),
        "The other ranks wait for it at every collective: fix its loading first "
        "(attach.loader-bound), or look at what differs on it (its shard, its storage, "
        "its CPUs).",
    )


def _throttled(r: StageResult) -> Finding | None:
    periods = value(r.metrics, quantity="nr_periods")
    throttled = value(r.metrics, quantity="nr_throttled")
    if not periods or throttled is None or throttled / periods < THROTTLED_SHARE:
        return None
    seconds = value(r.metrics, quantity="throttled_s") or 0.0
    return Finding(
        "attach.throttled",
        Severity.WARNING,
        f"The job's cgroup was throttled in {throttled / periods:.0%} of its CPU periods",
        f"{throttled:.0f} of {periods:.0f} periods, {seconds:.2f} s throttled over "
        f"{r.parameters.seconds} s",
        "Raise the CPU limit (Kubernetes `resources.limits.cpu`) or drop it and keep the "
        "request; or fewer DataLoader workers, so that the quota is not spent in bursts.",
    )


def _worker_memory(r: StageResult, ranks: list[int]) -> Finding | None:
    grown = {p: g for p in ranks if (g := value(_of(r, p), quantity="worker_uss_growth"))}
    if not grown or max(grown.values()) < WORKER_GROWTH_BYTES:
        return None
    pid = max(grown, key=lambda p: grown[p])
    return Finding(
        "attach.worker-memory",
        Severity.WARNING,
        f"A DataLoader worker of {_who(r, pid)} grew {grown[pid] / MIB:,.0f} MiB of memory "
        f"of its own in {r.parameters.seconds} s",
        "USS (memory no other process shares) from /proc/PID/smaps_rollup at the start and the end",
        "Python objects the dataset holds (lists, dicts) are copied into each worker as "
        "they are read (pytorch/pytorch#13246): keep them in numpy arrays or Arrow, or "
        "fewer workers; `starvecheck loader --factory` measures the growth per worker.",
    )
