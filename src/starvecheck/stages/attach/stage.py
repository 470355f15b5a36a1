"""`attach PID`: a training job that is already running, read for some seconds without
touching it.

  1. the job (target.py): the process, its children, every rank under a torchrun agent
     or with --all; refused in one line where it is not a Python process with torch;
  2. for --duration seconds, at once: py-spy samples every rank and its subprocesses,
     non-blocking (spy.py), while /proc and the cgroup are read once a second
     (readings.py);
  3. each sample classified (classify.py): the main thread's time waiting for data,
     in the step, copying, waiting on the GPU or the other ranks; each DataLoader
     worker's (the subprocesses whose stack runs `_worker_loop`) reading, decoding,
     tokenizing, collating, handing batches over or idle.

Where the stacks cannot be read (py-spy missing, ptrace refused) the /proc part runs
and a caveat says what was not seen. The result carries every figure, labelled by rank
and process; judging is advice/attach.py's.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import StageResult
from starvecheck.core.signals import check_signals, signals_raise
from starvecheck.core.status import UsageError
from starvecheck.stages.attach import budget, classify, sampling, source, spy
from starvecheck.stages.attach.gpus import GpuWatch
from starvecheck.stages.attach.readings import Watch, cgroup_dir
from starvecheck.stages.attach.target import Job, Process, descendants_of, find
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.options import AttachOptions

if TYPE_CHECKING:
    from starvecheck.scratch.directory import Scratch
    from starvecheck.stages.attach.spy import Stacks

QUICK_S = 5.0


@dataclass(frozen=True)
class Plan:
    job: Job
    seconds: float
    rate: int
    effective_cpus: int


def _metric(name: str, value: float | None, unit: str, **labels: object) -> list[Metric]:
    if value is None:
        return []
    return [Metric.single(f"attach.{name}", round(float(value), 4), unit, labels)]


def _shares(
    counts: Counter[str], total: int, name: str, quantity: str, **lab: object
) -> list[Metric]:
    out: list[Metric] = []
    for kind, n in sorted(counts.items()):
        out += _metric(f"{name}.{kind}", n / total, "share", quantity=quantity, kind=kind, **lab)
    return out


def read_stacks(
    rank: Process, stacks: Stacks, src: classify.Source
) -> tuple[list[Metric], list[int], str]:
    """The shares of one rank's main thread, its loading, its workers and their feeder
    threads, from its samples; the workers seen; the main thread's `other` frames."""
    lab = {"rank": rank.rank, "pid": rank.pid}
    main = stacks.by_thread.get((rank.pid, rank.pid), [])
    total = sum(n for _, n in main)
    out: list[Metric] = _metric("main.samples", total, "samples", quantity="samples", **lab)
    kinds: Counter[str] = Counter()
    loading: Counter[str] = Counter()
    others: Counter[str] = Counter()
    for frames, n in main:
        kind = classify.main_kind(frames, src)
        kinds[kind] += n
        if kind == "data":
            loading[classify.loading_kind(classify.loading_frames(frames), src)] += n
        elif kind == "other":
            others[classify.named(frames)] += n
    if total:
        out += _shares(kinds, total, "main", "main_share", **lab)
        out += _shares(loading, total, "main.loading", "main_loading_share", **lab)
    worker_kinds: Counter[str] = Counter()
    workers: set[int] = set()
    feeding = feeders = 0
    for (pid, _tid), samples in stacks.by_thread.items():
        if pid == rank.pid:
            continue
        for frames, n in samples:
            after = classify.worker_frames(frames)
            if after is not None:
                workers.add(pid)
                worker_kinds[classify.loading_kind(after, src)] += n
            busy = classify.feeder_busy(frames)
            if busy is not None:
                feeders += n
                feeding += n if busy else 0
    wtotal = sum(worker_kinds.values())
    out += _metric("workers.found", len(workers), "workers", quantity="workers_found", **lab)
    if wtotal:
        out += _shares(worker_kinds, wtotal, "workers", "worker_share", **lab)
    if feeders:
        busy = feeding / feeders
        out += _metric("workers.feeder_busy", busy, "share", quantity="feeder_busy_share", **lab)
    top = "; ".join(f"{what} {n / total:.0%}" for what, n in others.most_common(3)) if total else ""
    return out, sorted(workers), top


def read_procs(rank: Process, workers: list[int], watch: Watch) -> list[Metric]:
    """CPU, run queue, blocked time, memory and reads of a rank and its workers."""
    lab = {"rank": rank.rank, "pid": rank.pid}
    out: list[Metric] = []
    main = watch.series.get(rank.pid)
    if main is not None and main.seconds > 0:
        s = main.seconds
        for name, what, unit, quantity in (
            ("main.cpu", _per(main.delta("cpu_s"), s), "CPUs", "main_cpus"),
            ("main.thread_cpu", _per(main.delta("thread_cpu_s"), s), "CPUs", "main_thread_cpus"),
            ("main.uss_growth", main.delta("uss"), "bytes", "main_uss_growth"),
            ("main.read", _per(main.delta("read_bytes"), s), "bytes/s", "main_read_bytes_per_s"),
        ):
            out += _metric(name, what, unit, quantity=quantity, **lab)
        if main.cpu_per_s:
            each = [round(x, 3) for x in main.cpu_per_s]
            lab_each = {"quantity": "main_cpus_each_s", **lab}
            out.append(Metric.repeated("attach.main.cpu_each_s", each, "CPUs", lab_each))
    series = [watch.series[w] for w in workers if w in watch.series]
    series = [x for x in series if x.seconds > 0]
    if series:
        s = max(x.seconds for x in series)
        cpu = sum(x.delta("cpu_s") or 0.0 for x in series)
        runq = sum(x.delta("runq_s") or 0.0 for x in series)
        alive = sum(x.seconds for x in series)
        out += _metric("workers.cpu", cpu / s, "CPUs", quantity="workers_cpus", **lab)
        out += _metric("workers.runq", runq / s, "CPUs", quantity="workers_runq_cpus", **lab)
        out += _metric("workers.blocked", max(0.0, alive - cpu - runq) / alive, "share",
                       quantity="workers_blocked_share", **lab)  # fmt: skip
        growth = [g for x in series if (g := x.delta("uss")) is not None]
        if growth:
            out += _metric("workers.uss_growth", max(growth), "bytes",
                           quantity="worker_uss_growth", **lab)  # fmt: skip
        read = sum(x.delta("read_bytes") or 0.0 for x in series)
        out += _metric(
            "workers.read", read / s, "bytes/s", quantity="workers_read_bytes_per_s", **lab
        )
    return out


def _per(x: float | None, seconds: float) -> float | None:
    return None if x is None else x / seconds


class AttachStage(BaseStage[AttachOptions, Plan]):
    name = "attach"

    def plan(self, options: AttachOptions, ctx: RunContext) -> Plan:
        job = find(options.pid, options.all_ranks)
        seconds = options.seconds or (QUICK_S if options.quick else 10.0)
        return Plan(job, seconds, options.rate, ctx.effective_cpus)

    def measure(self, plan: Plan, ctx: RunContext) -> StageResult:
        start = time.perf_counter()
        caveats: list[Caveat] = []
        binary = spy.py_spy()
        owned = {r.pid: list(plan.job.children[r.pid]) for r in plan.job.ranks}
        watch = Watch(owned, cgroup_dir(plan.job.ranks[0].pid))
        gpus = GpuWatch([p for r, kids in owned.items() for p in (r, *kids)])
        sampler: sampling.Sampling | None = None
        if binary is None:
            caveats.append(Caveat("attach.no-stacks", NO_PY_SPY))
        # py-spy's files in a marked scratch directory (removed on every way out but
        # SIGKILL, after which `starvecheck clean` proves it ours); SIGTERM and SIGHUP
        # unwind like Ctrl-C, so that py-spy is ended and the directory removed.
        with signals_raise(), _scratch(binary is not None) as scratch:
            if binary is not None and scratch is None:
                caveats.append(Caveat("attach.no-stacks", NO_SCRATCH))
            try:
                if binary is not None and scratch is not None:
                    try:
                        sampler = sampling.Sampling(
                            owned, plan.seconds, plan.rate, binary, scratch, plan.effective_cpus
                        )
                    except OSError as e:  # py-spy could not be started: /proc's part alone
                        why = f"py-spy could not be started: {e.strerror or e}"
                        caveats.append(Caveat("attach.no-stacks", f"Python stacks not "
                                              f"sampled: {why}; the figures below are /proc's "
                                              "alone"))  # fmt: skip
                recorders = sampler.samplers if sampler is not None else {}
                _wait(plan, ctx, watch, recorders, gpus, sampler)
            finally:
                if sampler is not None:
                    sampler.stop()
                gpus.close()
            metrics, found, tops = _read_all(plan, watch, recorders, caveats)
        metrics += _read_gpus(gpus, caveats)
        if sampler is not None:
            metrics += _read_cost(plan, sampler, metrics, caveats)
        params = {
            "pid": plan.job.agent.pid if plan.job.agent else plan.job.ranks[0].pid,
            "ranks": [
                {"pid": r.pid, "rank": r.rank, "command": r.command, "workers": found[r.pid]}
                for r in plan.job.ranks
            ],
            "agent": plan.job.agent.describe() if plan.job.agent else None,
            "seconds": plan.seconds,
            "rate": sampler.rate if sampler is not None else min(plan.rate, spy.RATE_CEILING),
            "rate_requested": min(plan.rate, spy.RATE_CEILING),
            "sampler": SAMPLER if sampler is not None and sampler.samplers else None,
            "effective_cpus": plan.effective_cpus,
            "other_frames": tops,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "job_pids": g.job_pids,
                    "other_pids": g.other_pids,
                }
                for g in gpus.gpus
            ],
            "gpu_read": gpus.reason or gpus.chosen_by,
        }
        took = round(time.perf_counter() - start, 3)
        return StageResult(
            "attach", params, tuple(metrics), caveats=tuple(caveats), duration_s=took
        )


NO_SCRATCH = (
    "Python stacks not sampled: no scratch directory for py-spy's files could be made in "
    "the temporary directory (set TMPDIR to a writable directory); the figures below are "
    "/proc's alone"
)
NO_PY_SPY = (
    "Python stacks not sampled: py-spy is not installed (pip install 'starvecheck[attach]'); "
    "the figures below are /proc's alone"
)
SAMPLER = "py-spy record --nonblocking --idle --threads (the rank; each DataLoader worker)"


@contextlib.contextmanager
def _scratch(wanted: bool) -> Iterator[Scratch | None]:
    """A marked scratch directory in the temporary directory for py-spy's files, where
    py-spy runs; None where it does not, or the directory cannot be made (then no stacks
    are sampled, and a caveat says why)."""
    if not wanted:
        yield None
        return
    import tempfile

    from starvecheck.scratch.directory import Scratch

    try:
        scratch = Scratch(tempfile.gettempdir(), prefix="starvecheck-attach-")
        scratch.create()
    except (OSError, UsageError):
        yield None
        return
    try:
        yield scratch
    finally:
        scratch.cleanup()


def _wait(
    plan: Plan,
    ctx: RunContext,
    watch: Watch,
    recorders: dict[int, sampling.RankSampler],
    gpus: GpuWatch,
    sampler: sampling.Sampling | None = None,
) -> None:
    """Read /proc once a second while py-spy samples, until both are done (py-spy gets
    15 s past the duration to write its samples); py-spy's cost checked, and workers
    started since sampled, at each tick (sampling.py)."""
    t0 = time.perf_counter()
    deadline = t0 + plan.seconds + (15.0 if recorders else 0.0)
    while time.perf_counter() < deadline:
        check_signals()
        elapsed = time.perf_counter() - t0
        ctx.progress(f"sampling for {plan.seconds:.0f} s", int(elapsed), int(plan.seconds))
        if elapsed >= plan.seconds and all(r.done() for r in recorders.values()):
            break
        time.sleep(min(1.0, plan.seconds - elapsed) if elapsed < plan.seconds else 0.1)
        # workers started since (a new epoch's)
        found = descendants_of([r.pid for r in plan.job.ranks])
        for owner, kids in found.items():
            for child in kids:
                watch.add(child, owner)
        if sampler is not None:
            sampler.tick(found)
        watch.tick()
        gpus.tick()


def _read_all(
    plan: Plan,
    watch: Watch,
    recorders: dict[int, sampling.RankSampler],
    caveats: list[Caveat],
) -> tuple[list[Metric], dict[int, list[int]], dict[str, str]]:
    machine = watch.finish()
    metrics: list[Metric] = []
    found: dict[int, list[int]] = {}
    tops: dict[str, str] = {}
    for r in plan.job.ranks:
        workers = watch.owned(r.pid)
        rec = recorders.get(r.pid)
        try:
            stacks = rec.stacks() if rec is not None else None
        except (spy.NotAllowed, RuntimeError) as e:
            why = str(e) if isinstance(e, spy.NotAllowed) else f"py-spy: {e}"
            caveats.append(
                Caveat(
                    "attach.no-stacks",
                    f"Python stacks of {r.describe()} not sampled: {why}; its figures below "
                    "are /proc's alone",
                )
            )
            stacks = None
        if stacks is not None:
            got, seen, top = read_stacks(r, stacks, source.Lines(_cwd(r.pid)))
            metrics += got
            workers = seen or workers
            if top:
                tops[str(r.pid)] = top
            lab = {"rank": r.rank, "pid": r.pid}
            metrics += _metric("dropped", stacks.errors, "samples", quantity="dropped", **lab)
        found[r.pid] = workers
        metrics += read_procs(r, workers, watch)
    for key in MACHINE:
        metrics += _metric(f"machine.{key}", machine.get(key), MACHINE[key], quantity=key)
    return metrics, found, tops


def _read_gpus(gpus: GpuWatch, caveats: list[Caveat]) -> list[Metric]:
    """Each of the job's GPUs' utilization each second; a caveat where the job uses
    CUDA and NVML gave nothing, or a GPU is shared with processes not the job's."""
    if gpus.missing:
        caveats.append(Caveat("attach.no-gpu", f"GPU utilization not read: {gpus.reason}"))
    out: list[Metric] = []
    for g in gpus.gpus:
        lab = {"gpu": g.index, "quantity": "gpu_utilization"}
        if g.utilization:
            out.append(Metric.repeated("attach.gpu.utilization", g.utilization, "%", lab))
        if g.other_pids:
            others = ", ".join(str(p) for p in g.other_pids[:8])
            caveats.append(
                Caveat(
                    "attach.gpu-shared",
                    f"GPU {g.index} also runs PIDs {others}, not the job's: its "
                    "utilization includes their work",
                )
            )
    return out


def _read_cost(
    plan: Plan, sampler: sampling.Sampling, metrics: list[Metric], caveats: list[Caveat]
) -> list[Metric]:
    """What attach's sampling took (py-spy's CPU, from the kernel's accounting), the rate
    it sampled at, what it dropped or did not take; a caveat for each that bears on
    the answer (budget.py says why the rate may be lower than asked)."""
    cost = sampler.cost()
    out = _metric("sampler.rate", cost.rate, "samples/s", quantity="sampler_rate")
    out += _metric("sampler.cpu", cost.spy_cpus, "CPUs", quantity="sampler_cpus")
    out += _metric("sampler.cpu_s", cost.spy_cpu_s, "s", quantity="sampler_cpu_seconds")
    out += _metric("sampler.budget", cost.budget_cpus, "CPUs", quantity="sampler_budget_cpus")
    out += _metric("sampler.cpu_steady", cost.steady_cpus, "CPUs", quantity="sampler_steady_cpus")
    if cost.lowered and cost.sample_s >= plan.seconds:  # else said below
        caveats.append(
            Caveat(
                "attach.rate-lowered",
                f"stacks sampled at {cost.rate}/s, not {cost.requested}/s: {cost.lowered}",
            )
        )
    got = budget.samples_expected(cost.rate, cost.sample_s)
    if cost.sample_s < plan.seconds:
        need = budget.duration_within_budget(cost.threads, cost.budget_cpus)
        more = (
            f"`--duration {math.ceil(need)}` gives {budget.MIN_SAMPLES} within it"
            if need <= MAX_DURATION_S
            else f"no --duration up to {MAX_DURATION_S:.0f} s gives {budget.MIN_SAMPLES}"
        )
        what = (
            f"sampled for the first {cost.sample_s:.0f} s only ({got} samples)"
            if cost.sample_s >= 1
            else "not sampled"
        )
        caveats.append(
            Caveat(
                "attach.few-samples" if cost.sample_s >= 1 else "attach.no-stacks",
                f"Python stacks {what}: {cost.threads:,} threads cost py-spy about "
                f"{cost.threads * budget.COST_PER_THREAD_S:.2f} CPU seconds a sample, more "
                f"than attach's budget ({cost.budget_cpus:.2f} CPUs, "
                f"{budget.BUDGET_SHARE:.0%} of the machine's) allows at 1/s; {more}",
            )
        )
    elif got < budget.MIN_SAMPLES:
        need = budget.duration_for(cost.rate)
        more = (
            f"`--duration {need}` gives {budget.MIN_SAMPLES}"
            if need <= MAX_DURATION_S
            else f"even `--duration {MAX_DURATION_S:.0f}` gives only "
            f"{budget.samples_expected(cost.rate, MAX_DURATION_S)}"
        )
        caveats.append(
            Caveat(
                "attach.few-samples",
                f"at {cost.rate}/s, {plan.seconds:g} s gives about {got} samples of each "
                f"thread, fewer than the {budget.MIN_SAMPLES} a share needs; {more}",
            )
        )
    others = next((m.value for m in metrics if m.name == "attach.machine.others_cpus"), None)
    busy = isinstance(others, float | int) and others >= plan.effective_cpus * 0.5
    if cost.spy_cpu_s > 0 and (cost.over_budget or busy):
        steady = (
            f", {cost.steady_cpus:.3f} past its start-up" if cost.steady_cpus is not None else ""
        )
        why = (
            f"more than its budget of {cost.budget_cpus:.2f} CPUs, even at {cost.rate}/s"
            if cost.over_budget
            else "the machine's CPUs were busy, so that CPU was taken from the job and others"
        )
        caveats.append(
            Caveat(
                "attach.sampler-cpu",
                f"attach's sampling (py-spy) took {cost.spy_cpus:.3f} CPUs "
                f"({cost.spy_cpu_s:.2f} CPU seconds over {cost.seconds:g} s{steady}): {why}",
            )
        )
    for r in plan.job.ranks:
        s = sampler.samplers.get(r.pid)
        if s is None:
            continue
        lab = {"rank": r.rank, "pid": r.pid}
        missed = max(0, s.expected - s.taken)
        out += _metric("sampler.not_taken", missed, "samples", quantity="samples_not_taken",
                       **lab)  # fmt: skip
        if s.progress.behind_s is not None:
            out += _metric("sampler.behind", s.progress.behind_s, "s", quantity="sampler_behind_s",
                           **lab)  # fmt: skip
        out += _metric("workers.not_sampled", len(s.skipped), "workers",
                       quantity="workers_not_sampled", **lab)  # fmt: skip
        dropped = s.progress.errors or 0
        if missed > max(1, 0.1 * s.expected) or dropped > max(1, 0.05 * s.taken):
            behind = (
                f"; it fell {s.progress.behind_s:.1f} s behind"
                if s.progress.behind_s is not None
                else ""
            )
            caveats.append(
                Caveat(
                    "attach.samples-dropped",
                    f"{r.describe()}: py-spy took {s.taken} of the {s.expected} samples its "
                    f"rate should have given and dropped {dropped} (stacks caught "
                    f"mid-change){behind}; the shares are read from those it kept",
                )
            )
        if s.skipped:
            caveats.append(
                Caveat(
                    "attach.workers-not-sampled",
                    f"{len(s.skipped)} DataLoader worker(s) of {r.describe()} not sampled "
                    f"(at most {budget.MAX_WORKERS} a rank, to bound attach's cost, or their "
                    "stacks could not be read); their /proc figures are read all the same",
                )
            )
    return out


MAX_DURATION_S = 600.0  # --duration's ceiling (cli/attach.py)

MACHINE = {
    "others_cpus": "CPUs",
    "nr_periods": "periods",
    "nr_throttled": "periods",
    "throttled_s": "s",
    "shm_used_bytes": "bytes",
    "shm_growth_bytes": "bytes",
}


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


STAGE = AttachStage()
