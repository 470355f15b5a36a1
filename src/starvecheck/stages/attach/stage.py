"""`attach PID`: a training job that is already running, read for some seconds without
touching it.

  1. the job (target.py): the process, its children, every rank under a torchrun agent
     or with --all; refused in one line where it is not a Python process with torch;
  2. for --duration seconds, at once: py-spy samples every rank and its subprocesses,
     non-blocking (spy.py), while /proc and the cgroup are read once a second
     (readings.py), with whether each rank stopped, exited or exec'd meanwhile;
  3. each sample classified (classify.py): the training loop's time (in whichever
     thread runs it) waiting for data (the DataLoader, or its own fetch such as a
     `get_batch`), in the step, copying, waiting on the GPU or the other ranks; each
     DataLoader worker's (the subprocesses whose stack runs `_worker_loop`) reading,
     decoding, tokenizing, collating, handing batches over, starting or idle; the
     loop's wait split by stage of loading (waitsplit.py). Each share carries its 95%
     interval, from its samples in the order taken (core/intervals.worth: one long
     wait sampled many times is worth its runs); judging gives a verdict only where
     it allows.

Where the stacks cannot be read (py-spy missing, ptrace refused) the /proc part runs
and a caveat says what was not seen. The result carries every figure, labelled by rank
and process, filled once as attach's record (core/schema/attachfigures.AttachFigures)
and written as its metrics; judging is advice/attach.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from starvecheck.core import clocks
from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.attach import Gpu, Rank
from starvecheck.core.schema.attachfigures import AttachFigures, GpuUse, Machine, RankFigures
from starvecheck.core.schema.figure import Figure
from starvecheck.core.signals import check_signals, signals_raise
from starvecheck.probe import process
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.attach import budget, costs, fate, ids, sampling, source, spy
from starvecheck.stages.attach.gpus import GpuWatch
from starvecheck.stages.attach.readings import Watch, cgroup_dir
from starvecheck.stages.attach.shares import figure, read_stacks
from starvecheck.stages.attach.target import Job, Process, descendants_of, find
from starvecheck.stages.base import BaseStage, RunContext
from starvecheck.stages.options import AttachOptions

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Plan:
    job: Job
    seconds: float
    rate: int
    effective_cpus: int


def _figure(value: float | None) -> Figure | None:
    """A figure as attach writes it (rounded to 4 places); None where not read."""
    return None if value is None else figure(value)


def read_procs(
    rank: Process, workers: list[int], watch: Watch, into: RankFigures | None = None
) -> RankFigures:
    """CPU, run queue, blocked time, memory and reads of a rank and its workers: its
    record (`into`, what its stacks gave) with them."""
    out = into or RankFigures(rank.pid, rank.rank)
    main = watch.series.get(rank.pid)
    if main is not None and main.seconds > 0:
        s = main.seconds
        out = replace(
            out,
            main_cpus=_figure(_per(main.delta("cpu_s"), s)),
            main_thread_cpus=_figure(_per(main.delta("thread_cpu_s"), s)),
            main_uss_growth=_figure(main.delta("uss")),
            main_read=_figure(_per(main.delta("read_bytes"), s)),
        )
        if main.cpu_per_s:
            each = [round(x, 3) for x in main.cpu_per_s]
            out = replace(out, main_cpus_each_s=Figure.repeated(each))
    series = [watch.series[w] for w in workers if w in watch.series]
    series = [x for x in series if x.seconds > 0]
    if series:
        # Per second of the window the rank was read over: where a new epoch replaced
        # the workers, none lived through all of it, and the longest life (the divisor
        # before) read a -j 1 ImageNet job's workers at 1.01 CPUs for 0.81.
        whole = main.seconds if main is not None else 0.0
        s = max(whole, *(x.seconds for x in series))
        cpu = sum(x.delta("cpu_s") or 0.0 for x in series)
        runq = sum(x.delta("runq_s") or 0.0 for x in series)
        alive = sum(x.seconds for x in series)
        # A worker started inside the window (a new epoch's) is not growth from zero:
        # only those alive from the start, read again at the end, are compared.
        growth = [g for x in series if x.from_start and (g := x.delta("uss")) is not None]
        read = sum(x.delta("read_bytes") or 0.0 for x in series)
        out = replace(
            out,
            workers_cpus=figure(cpu / s),
            workers_runq=figure(runq / s),
            workers_blocked=figure(max(0.0, alive - cpu - runq) / alive),
            worker_uss_growth=figure(max(growth)) if growth else None,
            workers_read=figure(read / s),
        )
    return out


def _per(x: float | None, seconds: float) -> float | None:
    return None if x is None else x / seconds


class AttachStage(BaseStage[AttachOptions, Plan]):
    name = "attach"

    def plan(self, options: AttachOptions, ctx: RunContext) -> Plan:
        job = find(options.pid, options.all_ranks)
        return Plan(job, options.window_s, options.rate, ctx.effective_cpus)

    def measure(self, plan: Plan, ctx: RunContext) -> StageResult:
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
        with signals_raise(), costs.scratch(binary is not None) as scratch:
            if binary is not None and scratch is None:
                caveats.append(Caveat("attach.no-stacks", costs.NO_SCRATCH))
            try:
                if binary is not None and scratch is not None:
                    idle = _idle_before(watch, plan.effective_cpus)
                    try:
                        sampler = sampling.Sampling(
                            owned, plan.seconds, plan.rate, binary, scratch,
                            plan.effective_cpus, idle,
                        )  # fmt: skip
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
            ranks, machine, found, tops, loops = _read_all(plan, watch, recorders, caveats)
        figures = AttachFigures(ranks=ranks, machine=machine, gpus=_read_gpus(gpus, caveats))
        if sampler is not None:
            others = machine.others_cpus.value if machine.others_cpus else None
            cost, sampled = costs.read(
                sampler, plan.seconds, plan.effective_cpus, others, plan.job.ranks, caveats
            )
            figures = replace(figures, sampler=cost, ranks=_with(ranks, sampled))
        params = {
            "pid": plan.job.agent.pid if plan.job.agent else plan.job.ranks[0].pid,
            "ranks": [
                fate.of(
                    watch,
                    replace(
                        loops.get(r.pid, Rank(r.pid)),
                        rank=r.rank,
                        command=r.command,
                        workers=tuple(found[r.pid]),
                    ),
                ).to_dict()
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
                Gpu(g.index, g.name, tuple(g.job_pids), tuple(g.other_pids)).to_dict()
                for g in gpus.gpus
            ],
            "gpu_read": gpus.reason or gpus.chosen_by,
        }
        return StageResult("attach", params, figures.to_metrics(), caveats=tuple(caveats))


NO_PY_SPY = (
    "Python stacks not sampled: py-spy is not installed (pip install 'starvecheck[attach]'); "
    "the figures below are /proc's alone"
)
SAMPLER = "py-spy record --nonblocking --idle --threads (the rank; each DataLoader worker)"


def _wait(
    plan: Plan,
    ctx: RunContext,
    watch: Watch,
    recorders: dict[int, sampling.RankSampler],
    gpus: GpuWatch,
    sampler: sampling.Sampling | None = None,
) -> None:
    """Read /proc once a second while py-spy samples, until both are done (py-spy gets
    15 s past the duration to write its samples); workers started since sampled at each
    second, and py-spy's cost checked when it is due (sampling.py), between them too."""
    t0 = last = clocks.perf_counter()
    deadline = t0 + plan.seconds + (spy.END_GRACE_S if recorders else 0.0)
    found: dict[int, list[int]] = {}
    while clocks.perf_counter() < deadline:
        check_signals()
        elapsed = clocks.perf_counter() - t0
        ctx.progress(f"sampling for {plan.seconds:.0f} s", int(elapsed), int(plan.seconds))
        if elapsed >= plan.seconds and all(r.done() for r in recorders.values()):
            break
        step = min(1.0, plan.seconds - elapsed) if elapsed < plan.seconds else 0.1
        if sampler is not None:  # py-spy's cost read when it is due, not a second late
            step = min(step, max(0.05, sampler.next_in()))
        clocks.sleep(step)
        if clocks.perf_counter() - last < 0.95 and elapsed + step < plan.seconds:
            if sampler is not None:
                sampler.tick(found)
            continue
        last = clocks.perf_counter()
        # workers started since (a new epoch's)
        found = descendants_of([r.pid for r in plan.job.ranks])
        for owner, kids in found.items():
            for child in kids:
                watch.add(child, owner)
        if sampler is not None:
            sampler.tick(found)
        watch.tick()
        gpus.tick()


Ranks = tuple[RankFigures, ...]


def _with(ranks: Ranks, sampled: dict[int, RankFigures]) -> Ranks:
    """Each rank's figures with its sampling's (costs.read)."""
    out = []
    for r in ranks:
        s = sampled.get(r.pid)
        if s is not None:
            r = replace(r, not_taken=s.not_taken, behind=s.behind)
            r = replace(r, workers_not_sampled=s.workers_not_sampled)
        out.append(r)
    return tuple(out)


def _read_all(
    plan: Plan,
    watch: Watch,
    recorders: dict[int, sampling.RankSampler],
    caveats: list[Caveat],
) -> tuple[Ranks, Machine, dict[int, list[int]], dict[str, str], dict[int, Rank]]:
    """Each rank's figures (its stacks' and /proc's), the machine's; the workers found,
    each rank's `other` frames, what its loop was read from."""
    machine = watch.finish()
    caveats += fate.caveats(plan.job.ranks, plan.seconds, watch)
    ranks: list[RankFigures] = []
    found: dict[int, list[int]] = {}
    tops: dict[str, str] = {}
    loops: dict[int, Rank] = {}
    readers: list[source.Lines] = []
    for r in plan.job.ranks:
        workers = watch.owned(r.pid)
        rec = recorders.get(r.pid)
        try:
            stacks = rec.stacks() if rec is not None else None
        except (spy.NotAllowed, RuntimeError) as e:
            why = _refusal(r, e)
            caveats.append(
                Caveat(
                    "attach.no-stacks",
                    f"Python stacks of {r.describe()} not sampled: {why}; its figures below "
                    "are /proc's alone",
                )
            )
            stacks = None
        rank = RankFigures(r.pid, r.rank)
        if stacks is not None:
            stacks = ids.in_our_ids(stacks, r)
            with source.Lines.of(r.pid, SysRoot.from_environ()) as lines:
                rank, seen, top, loops[r.pid] = read_stacks(r, stacks, lines)
            readers.append(lines)
            workers = seen or workers
            # the most alive at once, not every worker of every epoch in the window
            at_once = watch.most_alive(workers) or len(workers)
            rank = replace(rank, workers_found=figure(at_once), dropped=_figure(stacks.errors))
            if top:
                tops[str(r.pid)] = top
        found[r.pid] = workers
        ranks.append(read_procs(r, workers, watch, rank))
    if (unread := source.caveat(readers)) is not None:
        caveats.append(Caveat("attach.source-unread", unread))
    read = {key: _figure(machine.get(key)) for key in MACHINE}
    if watch.others_each:  # each second: the spread the worker model's bound reads
        read["others_cpus_each_s"] = Figure.repeated([round(x, 3) for x in watch.others_each])
    return tuple(ranks), Machine(**read), found, tops, loops


def _read_gpus(gpus: GpuWatch, caveats: list[Caveat]) -> tuple[GpuUse, ...]:
    """Each of the job's GPUs' utilization each second; a caveat where the job uses
    CUDA and NVML gave nothing, or a GPU is shared with processes not the job's."""
    if gpus.missing:
        caveats.append(Caveat("attach.no-gpu", f"GPU utilization not read: {gpus.reason}"))
    out: list[GpuUse] = []
    for g in gpus.gpus:
        if g.utilization:
            out.append(GpuUse(g.index, Figure.repeated(g.utilization)))
        if g.other_pids:
            others = ", ".join(str(p) for p in g.other_pids[:8])
            caveats.append(
                Caveat(
                    "attach.gpu-shared",
                    f"GPU {g.index} also runs PIDs {others}, not the job's: its "
                    "utilization includes their work",
                )
            )
    return tuple(out)


# What Watch.finish gives of the machine, each a field of the record's Machine.
MACHINE = ("others_cpus", "load_average", "machine_cpus", "nr_periods", "nr_throttled",
           "throttled_s", "shm_used_bytes", "shm_growth_bytes")  # fmt: skip


IDLE_READ_S = 0.5  # the machine read before sampling, for the CPUs it leaves idle


def _idle_before(watch: Watch, effective_cpus: float) -> float | None:
    """The CPUs the machine (the job's allowed CPUs) left idle over IDLE_READ_S before
    py-spy starts: what attach's sampling may use without taking CPU from the job
    (budget.py); None where /proc/stat cannot say."""
    clocks.sleep(max(0.0, IDLE_READ_S - (clocks.perf_counter() - watch.t0)))
    got = watch.busy_since_start()
    if got is None:
        return None
    busy, seconds, cpus = got
    idle = budget.idle_cpus(busy, seconds, cpus)
    return None if idle is None else min(idle, float(effective_cpus or cpus))


def _refusal(r: Process, e: Exception) -> str:
    """Why py-spy could not read `r`: where ptrace was refused, or the kernel's rules
    say it must be (py-spy then often says only "No python processes found"), what
    this process lacks to read it and the exact grant (probe/process.py)."""
    facts = process.ptrace_facts(SysRoot.from_environ(), r.pid)
    if isinstance(e, spy.NotAllowed) or process.ptrace_allowed(facts) is False:
        return f"py-spy could not read it ({e}): {process.ptrace_missing(facts, r.pid)}"
    return f"py-spy: {e}"


STAGE = AttachStage()
