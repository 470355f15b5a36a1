"""Judging `attach PID`: a running job, read from its sampled stacks and /proc.

- `attach.data-wait`: the share of the training loop's samples waiting for data (inside
  the DataLoader's iteration, or in the fetch it calls between steps where it has no
  DataLoader), with its 95% interval (counted from its samples' runs, advice/attachwait.py),
  at the thresholds every command uses
  (advice/profile.severity: above 5% input-bound, above 20% highly); the rank that waits
  most where several were read. A verdict only where the interval lies wholly on one
  side of each threshold: too few samples, a job stopped in the window, no loop or no
  data path found give an INFO finding that says why and what would decide it
  (`attach.no-verdict` for further ranks without one). A rank that ended in the window
  is judged on the samples before, with no worker count predicted.
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
- `attach.load-stage`: the stage of loading that most of the judged rank's wait is
  (advice/attachstages.py), with its fix, where the wait is input-bound and the split's
  intervals decide it.
- `attach.straggler`: several ranks, one waiting for data 10 points more than the
  median of the others, beyond the samples' noise (its interval's low end above the
  others' high ends): the others wait for it at every collective.
- `attach.throttled`: the cgroup throttled the job in 5% of its periods or more.
- `attach.worker-memory`: a worker's USS grew 64 MiB or more over the seconds read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from starvecheck.advice import attachstages
from starvecheck.advice.attachwait import Wait, wait_of
from starvecheck.advice.attachwait import ci as share_ci
from starvecheck.advice.stepworkers import LOADER_LINE, no_figure, offline
from starvecheck.advice.workers import Cpus, Loop, WorkerAdvice, recommend_workers
from starvecheck.core import catalogue
from starvecheck.core.intervals import percent
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult
from starvecheck.core.schema.attach import (
    Loading,
    Main,
    Parameters,
    Rank,
    Share,
    share_of,
)
from starvecheck.core.schema.attachfigures import AttachFigures, RankFigures
from starvecheck.core.schema.figure import value_of

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
    read = {pid: w for pid in ranks if (w := wait_of(r, pid)) is not None}
    waits = {pid: w.share for pid, w in read.items() if w.severity is not None}
    unjudged = [pid for pid, w in read.items() if w.severity is None]
    if waits:
        pid = max(waits, key=lambda p: waits[p])
        out.append(_data_wait(r, pid, waits, read[pid]))
        split = _of(r, pid).wait
        stage = attachstages.finding(split, _who(r, pid), waits[pid], read[pid].severity)
        out += [stage] if stage is not None else []
        if read[pid].severity is not Severity.OK and not _rank(r, pid).ended:
            bound = _bound(r, pid, waits[pid])
            if bound is not None:
                out.append(bound)
        straggler = _straggler(r, waits, read)
        if straggler is not None:
            out.append(straggler)
    for i, pid in enumerate(unjudged):
        headline = not waits and i == 0
        out.append(_no_verdict(r, pid, read[pid], headline))
    out += [f for f in (_throttled(r), _worker_memory(r, ranks)) if f is not None]
    return out


def _params(r: StageResult) -> Parameters:
    return r.parameters.read(Parameters)


def _rank(r: StageResult, pid: int) -> Rank:
    """The rank `pid` as the parameters record it (an empty record where they do not)."""
    return next((x for x in _params(r).ranks if x.pid == pid), Rank(pid))


def _no_verdict(r: StageResult, pid: int, w: Wait, headline: bool) -> Finding:
    """No verdict on a rank's wait, with why, and what would give one: the data-wait
    finding itself where no rank has a verdict, else one of its own."""
    seconds = float(_params(r).seconds or 0.0)
    fix = ""
    if w.why.startswith("too few samples") and w.n and seconds:
        if w.decide_s is not None:
            fix = f"Run with --duration {min(3600, math.ceil(w.decide_s * 1.2))}."
            if w.effective is not None and w.effective < 0.9 * w.n:
                fix += (
                    " Its wait comes in runs of samples: a longer window sees more of them; "
                    "a higher --rate would not."
                )
    elif w.why.startswith("its data path"):
        fix = (
            "Read it with `watch` (starvecheck.watch around the loop), which times the "
            "loop's own wait for each batch."
        )
    title = f"{_who(r, pid)}: no verdict on its wait for data: {w.why}"
    evidence = f"{_who(r, pid)}: waits for data {w.text()} of its training loop's samples"
    if headline:
        return Finding(catalogue.ATTACH_DATA_WAIT, Severity.INFO, title, evidence, fix)
    return Finding(catalogue.ATTACH_NO_VERDICT, Severity.INFO, title, evidence, fix)


def _ranks(r: StageResult) -> list[int]:
    return [x.pid for x in _params(r).ranks]


def _who(r: StageResult, pid: int) -> str:
    rank = _rank(r, pid).rank
    return f"PID {pid}" + (f" (rank {rank})" if rank is not None else "")


def _figures(r: StageResult) -> AttachFigures:
    return r.records(AttachFigures)


def _of(r: StageResult, pid: int) -> RankFigures:
    """The rank `pid`'s figures (core/schema/attachfigures.py)."""
    return _figures(r).rank(pid)


K = TypeVar("K", Main, Loading)


def _share(shares: Sequence[Share[K]], kind: K) -> float | None:
    """The share of this kind (None where none was sampled)."""
    found = share_of(shares, kind)
    return None if found is None else found.value


def _breakdown(shares: Sequence[Share[K]], kinds: Sequence[K]) -> str:
    parts = [f"{k} {v:.0%}" for k in kinds if (v := _share(shares, k)) is not None and v >= 0.005]
    return ", ".join(parts)


MAIN_KINDS, LOAD_KINDS = tuple(Main), tuple(Loading)


def _data_wait(r: StageResult, pid: int, waits: dict[int, float], w: Wait) -> Finding:
    share = waits[pid]
    sev = w.severity or Severity.INFO
    seconds = _params(r).seconds or 0.0
    thread = _rank(r, pid).thread
    where = "main thread" if thread in (None, "", "MainThread") else f"loop's thread '{thread}'"
    evidence = (
        f"{_who(r, pid)}: {w.n} samples of its {where} over {seconds:g} s: waits for data "
        f"{w.text()}; " + _breakdown(_of(r, pid).main, MAIN_KINDS)
    )
    path = _rank(r, pid).data_path
    if isinstance(path, str) and path != "DataLoader":
        evidence += f"; no DataLoader: its data is fetched by {path}, counted as its wait"
    other = _params(r).other_frames.get(str(pid))
    if other:
        evidence += f" (other: {other})"
    evidence += attachstages.sentence(attachstages.read(_of(r, pid).wait))
    gpus = _gpus(r)
    if gpus:
        evidence += f"; {gpus}"
    if len(waits) > 1:
        evidence += "; every rank's wait: " + ", ".join(
            f"{_who(r, p)} {share_ci(r, p, share)}" for p, share in sorted(waits.items())
        )
    ci = percent(w.low, w.high)
    if sev is Severity.OK:
        title = f"{_who(r, pid)} waits for data {share:.0%} ({ci}) of the time: its data keeps up"
        return Finding(catalogue.ATTACH_DATA_WAIT, sev, title, evidence)
    kind = "highly input-bound" if sev is Severity.CRITICAL else "input-bound"
    title = f"{_who(r, pid)} waits for data {share:.0%} ({ci}) of the time: {kind}"
    # What loading that kept up would give back: the wait's share of the loop's time,
    # taken at its interval's low end (the samples show at least that much waiting).
    gain = Gain(
        GainKind.STEP_SHARE,
        round(w.low, 4),
        "the loop's time waiting for data, its 95% interval's low end; at most what "
        "loading that keeps up gives back",
    )
    return Finding(
        catalogue.ATTACH_DATA_WAIT,
        sev,
        title,
        evidence,
        "See attach.loader-bound for why.",
        gain=gain,
    )


def _gpus(r: StageResult) -> str:
    """The job's GPUs' utilization over the seconds read (NVML, once a second)."""
    parts = [
        f"GPU {g.index} {u.value:.0f}% ({u.min:.0f}-{u.max:.0f}%)"
        for g in _figures(r).gpus
        if (u := g.utilization).value is not None and u.min is not None and u.max is not None
    ]
    return ("busy by NVML, median each second (range): " + ", ".join(parts)) if parts else ""


def _bound(r: StageResult, pid: int, share: float) -> Finding | None:
    m = _of(r, pid)
    workers = int(value_of(m.workers_found) or 0)
    loading = _breakdown(m.loading, LOAD_KINDS)
    cpus = float(r.parameters.effective_cpus or 1)
    if workers == 0:
        reading = _share(m.loading, Loading.READ) or 0.0
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
    wcpu = value_of(m.workers_cpus) or 0.0
    runq = value_of(m.workers_runq) or 0.0
    blocked = value_of(m.workers_blocked)
    kinds = _breakdown(m.workers, LOAD_KINDS)
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


def _receive_cpu(m: RankFigures, share: float) -> float:
    """The main thread's CPU spent receiving batches, as a share of its time: its
    samples in the hand-over, but no more than the CPU it used beyond the rest of its
    loop. A thread caught in the hand-over while the workers it waits on get no CPU
    (an fd passed by a worker's thread that cannot run) is waiting, not working."""
    sampled = _share(m.loading, Loading.HANDOVER) or 0.0
    thread = value_of(m.main_thread_cpus)
    if thread is None:
        return sampled
    return min(sampled, max(0.0, thread - (1.0 - share)))


def _step_cpu_ms(m: RankFigures, share: float, in_wait: float) -> float:
    """The main thread's CPU outside its wait, per second: its CPU less what it spent
    inside the wait (`in_wait`: loading at num_workers=0, receiving batches with
    workers), at most the time outside the wait. (Taking the whole wait as CPU, as
    before, read a thread blocked in its wait as idle in its step: a CPU-bound step
    left every CPU free for workers.)"""
    thread = value_of(m.main_thread_cpus) or 0.0
    return min(max(0.0, thread - in_wait), 1.0 - share) * 1e3


def _machine(r: StageResult, m: RankFigures, loading: float) -> dict[str, Any]:
    """The machine over the seconds read, for the worker model's bound: the other
    processes' CPUs each second (the whole window's figure where those are missing),
    the training process's own CPU less the loading it does itself (`loading`, CPUs),
    the machine's CPUs and load average."""
    machine = _figures(r).machine
    each = machine.others_cpus_each_s
    whole = value_of(machine.others_cpus)
    others = tuple(each.values) if each is not None and each.values else ()
    if not others and whole is not None:
        others = (whole,)
    main = value_of(m.main_cpus)
    return {
        "others_cpus_each": others,
        "process_cpus": None if main is None else max(0.0, main - loading),
        "machine_cpus": value_of(machine.machine_cpus),
        "load_average": value_of(machine.load_average),
    }


def _advise(
    r: StageResult, pid: int, loop: Loop, cpus: float, link: str, what: str, assumed: str
) -> Finding | None:
    advice = recommend_workers(loop, Cpus(cpus))
    title = f"{_who(r, pid)}: {link}"
    if advice is not None and advice.reason is not None:
        text, gain, fix = no_figure(advice, f"num_workers={advice.workers_now}")
        sev = Severity.WARNING if advice.changes else Severity.INFO
        return Finding(catalogue.ATTACH_LOADER_BOUND, sev, title, what, text, gain, fix=fix)
    if advice is None or advice.forecast is None:
        return Finding(catalogue.ATTACH_LOADER_BOUND, Severity.INFO, title, what)
    recommendation, gain, fix = _change(advice, cpus)
    sev = Severity.WARNING if advice.changes else Severity.INFO
    return Finding(
        catalogue.ATTACH_LOADER_BOUND, sev, title, what, recommendation + assumed, gain, fix=fix
    )


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


def _straggler(r: StageResult, waits: dict[int, float], read: dict[int, Wait]) -> Finding | None:
    """One rank waiting 10 points more than the others' median, and more than the
    samples' noise: its interval's low end above the others' high ends (median)."""
    if len(waits) < 2:
        return None
    pid = max(waits, key=lambda p: waits[p])
    rest = statistics.median(w for p, w in waits.items() if p != pid)
    rest_high = statistics.median(read[p].high for p in waits if p != pid)
    if waits[pid] - rest < STRAGGLER_POINTS or read[pid].low <= rest_high:
        return None
    return Finding(
        catalogue.ATTACH_STRAGGLER,
        Severity.WARNING,
        f"{_who(r, pid)} is the straggler: it waits for data {waits[pid]:.0%} of the time, "
        f"the other ranks {rest:.0%} (median)",
        ", ".join(f"{_who(r, p)}: {share_ci(r, p, w)}" for p, w in sorted(waits.items())),
        "The other ranks wait for it at every collective: fix its loading first "
        "(attach.loader-bound), or look at what differs on it (its shard, its storage, "
        "its CPUs).",
    )


def _throttled(r: StageResult) -> Finding | None:
    machine = _figures(r).machine
    periods = value_of(machine.nr_periods)
    throttled = value_of(machine.nr_throttled)
    if not periods or throttled is None or throttled / periods < THROTTLED_SHARE:
        return None
    seconds = value_of(machine.throttled_s) or 0.0
    return Finding(
        catalogue.ATTACH_THROTTLED,
        Severity.WARNING,
        f"The job's cgroup was throttled in {throttled / periods:.0%} of its CPU periods",
        f"{throttled:.0f} of {periods:.0f} periods, {seconds:.2f} s throttled over "
        f"{_params(r).seconds} s",
        "Raise the CPU limit (Kubernetes `resources.limits.cpu`) or drop it and keep the "
        "request; or fewer DataLoader workers, so that the quota is not spent in bursts.",
    )


def _worker_memory(r: StageResult, ranks: list[int]) -> Finding | None:
    grown = {p: g for p in ranks if (g := value_of(_of(r, p).worker_uss_growth))}
    if not grown or max(grown.values()) < WORKER_GROWTH_BYTES:
        return None
    pid = max(grown, key=lambda p: grown[p])
    return Finding(
        catalogue.ATTACH_WORKER_MEMORY,
        Severity.WARNING,
        f"A DataLoader worker of {_who(r, pid)} grew {grown[pid] / MIB:,.0f} MiB of memory "
        f"of its own in {_params(r).seconds} s",
        "USS (memory no other process shares) from /proc/PID/smaps_rollup at the start and the end",
        "Python objects the dataset holds (lists, dicts) are copied into each worker as "
        "they are read (pytorch/pytorch#13246): keep them in numpy arrays or Arrow, or "
        "fewer workers; `starvecheck loader --factory` measures the growth per worker.",
    )
