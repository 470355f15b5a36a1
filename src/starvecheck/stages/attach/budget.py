"""What attach's own sampling may cost the job it reads, and the rate that keeps it there.

py-spy reads every thread's stack at every sample, so its CPU grows with threads x rate:
about 130-190 microseconds of CPU per thread per sample (py-spy 0.4.3, 10 to 1,000 idle
threads, 2 CPUs; the rate and the flags hardly change it). At the default 50 samples a
second that is 1.5 CPUs for a process with 200 threads: on a busy machine that CPU is
taken from the job. So the rate is chosen to fit a budget (1% of the machine's CPUs,
`BUDGET_SHARE`), from the threads the job has before py-spy starts, and checked against
py-spy's own CPU once it runs (`refit_rate`).

Only what the answer needs is sampled: each rank (its threads, one py-spy without
`--subprocesses`) and its DataLoader workers (one py-spy each, at most `MAX_WORKERS`),
found from /proc (`workers_of`): not every child (a compile pool, a tokenizer server).
One py-spy a process costs less than one with `--subprocesses` (which also samples every
other child and watches for new ones): on the steady loop with two workers, 4 s at 5/s,
0.097 CPU seconds against 0.169-0.188.

The choices are pure functions of figures; the readers go through probe/'s SysRoot and
never raise.
"""

from __future__ import annotations

import math

from starvecheck.core.units import parse_uint
from starvecheck.probe import process
from starvecheck.probe.cpu import parse_status_field
from starvecheck.probe.load import parse_schedstat
from starvecheck.probe.sysroot import SysRoot

BUDGET_SHARE = 0.01  # of the machine's effective CPUs: attach's promise, "under 1%"
# Of the CPUs the machine left idle in the second before sampling: py-spy reads the job's
# memory from outside without stopping it, so CPU nobody was using is not taken from the
# job. A quarter of it, and never more than IDLE_CAP of the effective CPUs: the job's
# bursts use idle CPU too. Measured on 2 CPUs (docs/performance.md): half the idle CPUs
# let py-spy take 0.52 CPUs on a job with 3,000 threads, which ran 6.8% slower; 1% alone
# held a light loop to 4 samples a second, too few for a verdict in 10 s.
IDLE_SHARE = 0.25
IDLE_CAP = 0.05
COST_PER_THREAD_S = 200e-6  # py-spy CPU per thread per sample (measured 130-190 us): a margin
MIN_SAMPLES = 50  # samples of the loop for a share within about +-14 points (95%)
MAX_WORKERS = 8  # DataLoader workers sampled per rank; the rest counted, not sampled
REFIT_OVER = 1.25  # py-spy measured over budget by more than this: restarted slower
# py-spy measured well under its budget: restarted faster where the samples it would give
# in the time left are at least RAISE_OVER x what the rate it runs at gives, at a rate
# that keeps RAISE_MARGIN of the budget (its cost was read over a second or so).
RAISE_OVER = 1.5
RAISE_MARGIN = 0.8
# A reading of each py-spy's CPU is taken as up to this short (a thread's time not yet
# counted; where schedstat's nanoseconds cannot be read, /proc/PID/stat's 10 ms ticks can
# be shorter still: a rate raised too far is lowered by the check after it)
CPU_SLACK_S = 0.0005


def budget_cpus(effective_cpus: int | float | None, idle_cpus: float | None = None) -> float:
    """CPUs attach's sampling may take: 1% of the machine's (of one CPU where unknown),
    or a quarter of the CPUs left idle just before sampling, up to 5% of the machine's,
    where that is more (`idle_cpus`, measured; None: not measured, the 1% alone)."""
    cpus = effective_cpus if effective_cpus and effective_cpus > 0 else 1
    share = BUDGET_SHARE * float(cpus)
    if idle_cpus is None or not math.isfinite(idle_cpus) or idle_cpus <= 0:
        return share
    idle = IDLE_SHARE * min(float(idle_cpus), float(cpus))
    return max(share, min(idle, IDLE_CAP * float(cpus)))


def sampling_budget(effective_cpus: int | float | None, idle: float | None, threads: int) -> float:
    """The budget for a job with `threads` threads to sample: the idle CPUs raise it
    only for a job light enough that py-spy's lowest rate (1 a second) fits the 1%
    share; a heavier one keeps the 1% (with idle CPUs counted, 3,000 threads on 2 CPUs
    were sampled at 1/s, py-spy took 0.39 CPUs and the job ran 6% slower)."""
    floor = budget_cpus(effective_cpus)
    if over_budget(1, threads, floor):
        return floor
    return budget_cpus(effective_cpus, idle)


def idle_cpus(busy_s: float, seconds: float, cpus: float) -> float | None:
    """The CPUs nobody used over `seconds` in which the machine's (or the job's allowed
    CPUs') busy time grew by `busy_s`; None where the figures cannot say."""
    if not (math.isfinite(busy_s) and math.isfinite(seconds)) or seconds <= 0 or cpus <= 0:
        return None
    return max(0.0, min(float(cpus), cpus - busy_s / seconds))


def choose_rate(
    requested: int, threads: int, budget: float, cost_s: float = COST_PER_THREAD_S
) -> int:
    """The highest whole rate, at most `requested`, whose cost (threads x rate x cost_s
    CPU seconds a second) fits `budget` CPUs; at least 1 (py-spy's lowest): where even 1 a
    second costs more, `over_budget` says so."""
    requested = max(1, int(requested))
    per_sample = max(1, threads) * max(cost_s, 1e-9)
    if not math.isfinite(budget) or budget <= 0:
        return 1
    fits = budget / per_sample
    if not math.isfinite(fits):  # a huge budget over a tiny cost: every rate fits
        return requested
    return max(1, min(requested, _whole(fits)))


def over_budget(rate: int, threads: int, budget: float, cost_s: float = COST_PER_THREAD_S) -> bool:
    """Whether `rate` costs more than `budget` (the lowest rate can)."""
    return rate * max(1, threads) * cost_s > budget


def sample_seconds(
    rate: int, threads: int, budget: float, seconds: float, cost_s: float = COST_PER_THREAD_S
) -> float:
    """How long py-spy may sample at `rate` within the window: all of it where the rate
    fits the budget; else (1 a second, py-spy's lowest, still costing more) the whole
    seconds whose cost, spread over the window, fits: 0 where not even one does (3,000
    threads cost about 0.5 CPU seconds a sample: on 2 CPUs, one sample per 25 s)."""
    if not over_budget(rate, threads, budget, cost_s):
        return seconds
    if not math.isfinite(budget) or budget <= 0:
        return 0.0
    affordable = budget * seconds / (max(1, threads) * cost_s * max(1, rate))
    return float(min(seconds, _whole(affordable)))


def duration_within_budget(
    per_sample_cpu_s: float, budget: float, samples: int = MIN_SAMPLES
) -> float:
    """The window over which `samples` samples, each costing `per_sample_cpu_s` CPU
    seconds, fit the budget."""
    if not math.isfinite(budget) or budget <= 0 or not math.isfinite(per_sample_cpu_s):
        return math.inf
    return samples * max(0.0, per_sample_cpu_s) / budget


def refit_rate(rate: int, used_cpus: float, budget: float) -> int | None:
    """py-spy took `used_cpus` CPUs at `rate`: the rate that fits `budget`, where it took
    more than REFIT_OVER x the budget and a lower rate exists; else None (keep it)."""
    if rate <= 1 or not (math.isfinite(used_cpus) and math.isfinite(budget)) or budget <= 0:
        return None
    if used_cpus <= budget * REFIT_OVER:
        return None
    per_sample = used_cpus / rate
    fit = max(1, _whole(budget / per_sample)) if per_sample > 0 else rate
    return fit if fit < rate else None


def raise_rate(
    rate: int,
    requested: int,
    used_cpu_s: float,
    span_s: float,
    processes: int,
    budget: float,
    left_s: float,
    window_s: float,
    start_s: float = 0.3,
) -> int | None:
    """A higher rate where py-spy's cost, measured, was well under the estimate it was
    chosen by (the threads counted are every thread of the processes, but py-spy reads
    stacks of Python threads: CUDA's, NCCL's and OpenMP's threads cost it about 17 us a
    sample, a Python thread 110-190 us): `used_cpu_s` CPU seconds over `span_s` at
    `rate`, every py-spy together (`processes` of them, each reading up to CPU_SLACK_S
    short, counted against it). The rate that fits RAISE_MARGIN of the budget, at most
    `requested`; None where it is not higher, or where restarting (dropping what was
    sampled, `start_s` of start-up again) would not give RAISE_OVER x the samples of
    staying: `rate` over the `window_s` sampled against the new one over the `left_s`
    left."""
    figures = (used_cpu_s, span_s, budget, left_s, window_s)
    if rate < 1 or rate >= requested or not all(math.isfinite(x) for x in figures):
        return None
    if span_s <= 0 or budget <= 0:
        return None
    per_sample = (max(0.0, used_cpu_s) + CPU_SLACK_S * max(1, processes)) / (span_s * rate)
    if not per_sample > 0:  # a span so long the cost a sample underflows: no figure
        return None
    room = budget * RAISE_MARGIN / per_sample
    if not math.isfinite(room):
        return None
    fit = min(requested, _whole(room))
    if fit <= rate:
        return None
    stay = rate * max(0.0, window_s - start_s)
    move = fit * max(0.0, left_s - start_s)
    return fit if move >= RAISE_OVER * stay else None


def _whole(x: float) -> int:
    """The whole part, where 9.999999 from a division of figures that make 10 is 10."""
    return int(x + 1e-9)


def samples_expected(rate: int, seconds: float) -> int:
    return max(0, int(rate * seconds))


def duration_for(rate: int, samples: int = MIN_SAMPLES) -> int:
    """Seconds of sampling at `rate` that give `samples` samples (whole seconds)."""
    return math.ceil(samples / max(1, rate))


# --- readers (through SysRoot; never raise) ----------------------------------------------


def threads_of(pid: int, root: SysRoot | None = None) -> int | None:
    """The process's thread count (/proc/PID/status `Threads`), None where unreadable."""
    text = (root or SysRoot.from_environ()).read(f"/proc/{pid}/status").value
    value = parse_status_field(text, "Threads") if text else None
    return parse_uint(value) if value else None


def cpu_seconds(pid: int, root: SysRoot | None = None) -> float | None:
    """The process's CPU seconds so far: its threads' time on a CPU in nanoseconds
    (/proc/PID/task/*/schedstat), where readable, else user + system in clock ticks
    (/proc/PID/stat: a second's reading of py-spy at a few samples a second is one or
    two ticks, too coarse to tell its cost)."""
    root = root or SysRoot.from_environ()
    total, seen = 0.0, False
    for tid in root.listdir(f"/proc/{pid}/task")[:256]:
        text = root.read(f"/proc/{pid}/task/{tid}/schedstat").value
        got = parse_schedstat(text) if text else None
        if got is not None:
            total, seen = total + got[0], True
    if seen:
        return total
    read = process.stat(root, pid)
    return read.cpu_s if read is not None else None


SPAWN_MARKS = ("multiprocessing.spawn", "multiprocessing.forkserver")


def is_worker(
    cmdline: str | None, exe: str | None, rank_cmdline: str | None, rank_exe: str | None
) -> bool:
    """Whether a child of a rank looks like one of its DataLoader workers, by /proc alone:
    a fork of the rank (the same executable and command line), or a child started by
    multiprocessing's spawn or forkserver (its command line says so). Not the
    forkserver itself, not the resource tracker, not an unrelated child (a compile
    pool's `python -m ...`, a shell). The stacks confirm it later (`_worker_loop`)."""
    if not cmdline:
        return False
    if "resource_tracker" in cmdline:
        return False
    if any(mark in cmdline for mark in SPAWN_MARKS):
        return True  # a forkserver itself is told apart by its children (`workers_of`)
    return cmdline == rank_cmdline and exe is not None and exe == rank_exe


WORKER_NAME = "pt_data_worker"  # what torch (2.3+) names a DataLoader worker's main thread


def workers_of(
    rank: int, descendants: list[int], named_only: bool = False, root: SysRoot | None = None
) -> list[int]:
    """The descendants of `rank` that are its DataLoader workers. torch names each
    worker's main thread `pt_data_worker` (/proc/PID/comm): where any is so named, those
    are the workers, and a job's other forks (a pool of its own) are not. Else, an older
    torch: those that look like workers (`is_worker`), newest first (a new epoch's). A
    forkserver's children share its command line: the forkserver itself is left out as
    the parent of others. `named_only`: the job's workers were found by name before, so
    a child not so named is not one."""
    root = root or SysRoot.from_environ()
    named = [p for p in descendants if _comm(root, p) == WORKER_NAME]
    if named or named_only:
        return sorted(named)
    rank_cmd = root.read(f"/proc/{rank}/cmdline").value
    rank_exe = root.readlink(f"/proc/{rank}/exe").value
    found = []
    parents: set[int] = set()
    for pid in descendants:
        if (stat := process.stat(root, pid)) is not None:
            parents.add(stat.ppid)
    for pid in sorted(descendants, reverse=True):
        cmd = root.read(f"/proc/{pid}/cmdline").value
        exe = root.readlink(f"/proc/{pid}/exe").value
        if is_worker(cmd, exe, rank_cmd, rank_exe) and not _server(cmd, pid, parents):
            found.append(pid)
    return found


def is_named_worker(pid: int, root: SysRoot | None = None) -> bool:
    return _comm(root or SysRoot.from_environ(), pid) == WORKER_NAME


def _comm(root: SysRoot, pid: int) -> str | None:
    text = root.read(f"/proc/{pid}/comm").value
    return text.strip() if text else None


def _server(cmd: str | None, pid: int, parents: set[int]) -> bool:
    """A forkserver (or a fork of the rank that itself forks others): a parent of
    other candidates, not a worker."""
    return bool(cmd) and "forkserver" in (cmd or "") and pid in parents
