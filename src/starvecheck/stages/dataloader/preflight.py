"""Resources checked before DataLoader workers start: the open-file limit and /dev/shm.

Without these checks a low `ulimit -n` made `loader` hang for good in Streaming's
shared barrier (a worker that cannot open its lock file waits for the others
forever), or end in "Too many open files" tracebacks; a /dev/shm too small for the
batches in flight kills workers with SIGBUS. Here the work is lowered to what fits,
with a warning that says what was left out and how to measure it, or refused in one
line where not even num_workers=0 fits.
"""

from __future__ import annotations

import dataclasses
import os
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from starvecheck.core.status import UsageError
from starvecheck.core.units import format_bytes

# Open files a run needs, measured with `loader --quick` (Streaming included) polling
# /proc/PID/fd: about 28 to 34 in the main process with no workers (Streaming keeps an
# fd per shared-memory block, its threads open shards), 4 to 7 more per worker (the
# index and result queues' pipes, the resource sharer). `loader --quick --workers 0`
# ran at 32 once and failed with EMFILE at 36 once: the base has a margin of two.
FILES_BASE = 64
FILES_PER_WORKER = 8
# Tasks (processes and threads) a run starts under a pids limit (cgroup pids.max): a
# worker is a process with a thread or two of its own (the resource sharer's, which
# hands batches over); the main process starts a few threads (pin memory, the resource
# sharer's, torch's). A fork that fails leaves workers half started, each printing a
# traceback.
TASKS_BASE = 4
TASKS_PER_WORKER = 3
SHM = "/dev/shm"
SHM_MARGIN = 16 << 20
PlanT = TypeVar("PlanT")


@dataclass(frozen=True)
class Fit:
    workers: tuple[int, ...]  # the counts that fit
    warning: str | None  # what was left out and why, where anything was


def files_needed(workers: int) -> int:
    return FILES_BASE + FILES_PER_WORKER * workers


def raise_open_files(need: int) -> int:
    """Raise the soft open-file limit towards the hard one where it is below `need`
    (any process may, up to its hard limit); return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft if soft != resource.RLIM_INFINITY else 1 << 30
    target = need * 4 if hard == resource.RLIM_INFINITY else min(hard, max(need * 4, 4096))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fit_open_files(workers: Sequence[int], limit: int | None = None) -> Fit:
    """The worker counts whose open files fit under the limit (raised first where it
    can be); a UsageError where not even num_workers=0 fits."""
    counts = tuple(workers)
    most = max(counts, default=0)
    soft = raise_open_files(files_needed(most)) if limit is None else limit
    if soft < files_needed(0):
        raise UsageError(
            f"the open-file limit is {soft} (ulimit -n), below the {files_needed(0)} "
            "starvecheck needs even with num_workers=0: raise it (ulimit -n 1024)"
        )
    return _fit(
        counts,
        files_needed,
        soft,
        lambda dropped, need: (
            f"the open-file limit is {soft} (ulimit -n, its hard limit): num_workers={dropped} "
            f"would need {need} and was not measured; raise the limit (ulimit -n "
            f"{max(1024, need)}) to measure it"
        ),
    )


def _fit(
    counts: tuple[int, ...],
    need: Callable[[int], int],
    available: int,
    say: Callable[[str, int], str],
) -> Fit:
    """The counts whose need is within what is available; `say(dropped, need of the
    largest dropped)` the warning where any is left out."""
    kept = tuple(w for w in counts if need(w) <= available)
    if kept == counts:
        return Fit(counts, None)
    dropped = [w for w in counts if w not in kept]
    return Fit(kept, say(",".join(map(str, dropped)), need(max(dropped))))


def shm_free() -> int | None:
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None  # no /dev/shm: torch falls back to other sharing; nothing to check
    return st.f_bavail * st.f_frsize


def fit_shm(workers: Sequence[int], batch_bytes: int, prefetch: int, free: int | None) -> Fit:
    """The worker counts whose batches in flight (each worker holds `prefetch` batches
    in shared memory) fit in /dev/shm's free space, with a margin. num_workers=0 needs
    none, so it always fits."""
    counts = tuple(workers)
    if free is None:
        return Fit(counts, None)

    def need(w: int) -> int:
        return w * prefetch * batch_bytes * 2 + SHM_MARGIN if w else 0

    return _fit(
        counts,
        need,
        free,
        lambda dropped, most: (
            f"{SHM} has {format_bytes(free)} free: num_workers={dropped} would hold up to "
            f"{format_bytes(most)} of batches in shared memory and was not measured (workers "
            "would die of SIGBUS); give the container a larger /dev/shm (docker --shm-size, "
            "a Kubernetes emptyDir with medium: Memory)"
        ),
    )


def tasks_free() -> int | None:
    from starvecheck.probe.cgroup import pids_free
    from starvecheck.probe.sysroot import SysRoot

    return pids_free(SysRoot.from_environ())


def fit_tasks(workers: Sequence[int], free: int | None) -> Fit:
    """The worker counts whose processes and threads fit under the cgroup's pids limit
    (`free`: the tasks it can still start). num_workers=0 starts none of its own, so it
    always fits."""
    counts = tuple(workers)
    if free is None:
        return Fit(counts, None)

    def need(w: int) -> int:
        return TASKS_BASE + TASKS_PER_WORKER * w if w else 0

    return _fit(
        counts,
        need,
        free,
        lambda dropped, most: (
            f"the cgroup's pids limit (pids.max) lets {free} more processes and threads "
            f"start: num_workers={dropped} would need up to {most} and was not measured; "
            "raise the limit (docker --pids-limit, a Kubernetes pod's pid limit) to measure it"
        ),
    )


def fit_workers(workers: Sequence[int], batch_bytes: int, prefetch: int) -> Fit:
    """The three checks, as a stage runs them before its sweep."""
    files = fit_open_files(workers)
    tasks = fit_tasks(files.workers, tasks_free())
    shm = fit_shm(tasks.workers, batch_bytes, prefetch, shm_free())
    said = [w for w in (files.warning, tasks.warning, shm.warning) if w]
    return Fit(shm.workers, "; ".join(said) or None)


def fitted(plan: PlanT, batch_bytes: int, prefetch: int, warn: Callable[[str], None]) -> PlanT:
    """`plan` (a stage's plan, with a `workers` tuple) with the worker counts that fit;
    what was left out is a warning. None left (every count given was too many) is one
    line and exit 2."""
    fit = fit_workers(plan.workers, batch_bytes, prefetch)  # type: ignore[attr-defined]
    if not fit.workers:
        raise UsageError(fit.warning or "no worker count fits")
    if fit.warning:
        warn(fit.warning)
    return dataclasses.replace(plan, workers=fit.workers)  # type: ignore[type-var]
