"""Machine facts -> findings that matter to a training job.

Each check is a small function: it looks at the facts it needs, returns nothing
when it does not apply or its facts are unknown, an `ok` finding when the check
passed, or a finding with the evidence and the exact change. As in pyperf's
system check, passed checks are kept so a person sees what was looked at. The
checks of the process's share of the machine (CPUs, quota, /dev/shm, limits,
memory) are here; those of its devices (GPUs, NUMA, PCIe, storage) in
advice/devices.py; CHECKS lists them all, in the order they run.

`env` measures nothing, so it claims no throughput gains: gains are given only
where a fault is a blocker (the job fails or runs on the wrong device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from starvecheck.advice import devices
from starvecheck.advice.workers import Cpus, recommend_workers
from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Gain, GainKind, Severity
from starvecheck.core.units import format_bytes
from starvecheck.probe.machine import Machine

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

SHM_CRITICAL_BYTES = 1024**3
SHM_SUGGESTED = "16g"
MEMLOCK_LOW_BYTES = 64 * 1024**2
NOFILE_LOW = 4096
PIDS_LOW = 1024


def _ranks(m: Machine) -> int:
    """Training processes on this node: one per GPU, or one without GPUs."""
    return max(1, len(m.gpus))


def recommended_workers(m: Machine) -> int | None:
    """DataLoader workers per training process, from the CPUs alone (advice.workers)."""
    advice = recommend_workers(None, Cpus(m.cpu.effective_cpus, _ranks(m)))
    return advice.workers if advice is not None else None


def check_cpu(m: Machine) -> Finding | None:
    logical, eff = m.cpu.logical, m.cpu.effective_cpus
    workers = recommended_workers(m)  # known wherever the effective CPUs are
    if logical is None or eff is None or workers is None:
        return None
    per = f" per process ({_ranks(m)} GPUs share {eff} CPUs)" if _ranks(m) > 1 else ""
    if logical <= eff:
        return Finding(
            catalogue.ENV_CPU,
            Severity.OK,
            f"{eff} effective CPUs, as os.cpu_count() reports",
            f"os.cpu_count() = {logical}, affinity {m.cpu.affinity}, no lower quota.",
            f"num_workers={workers}{per} leaves a CPU for the training loop.",
            fix={"num_workers": workers},
        )
    limits = []
    if m.cpu.affinity is not None and m.cpu.affinity < logical:
        limits.append(f"CPU affinity allows {m.cpu.affinity} ({m.cpu.affinity_list})")
    if m.cpu.quota_cpus is not None:
        where = f" ({m.cgroup.quota_path})" if m.cgroup.quota_path else ""
        limits.append(f"the cgroup CPU quota is {m.cpu.quota_cpus:g} CPUs{where}")
    return Finding(
        catalogue.ENV_CPU_OVERSUBSCRIBED,
        Severity.WARNING,
        f"os.cpu_count() says {logical} CPUs, but this process can use {eff}",
        f"{'; '.join(limits)}. A DataLoader sized with num_workers=os.cpu_count() starts "
        f"{logical} worker processes that share {eff} CPUs: they preempt each other and the "
        "training loop, and each holds its own copy of the dataset object in memory.",
        f"Size workers from the effective CPUs: DataLoader(..., num_workers={workers}){per}. "
        "len(os.sched_getaffinity(0)) sees affinity but not the cgroup quota; pass the "
        "number explicitly or read it from `starvecheck env --json -` (cpu.effective_cpus).",
        fix={"num_workers": workers},
    )


def check_throttling(m: Machine) -> Finding | None:
    t = m.cgroup.throttling
    if t is None or t.nr_periods == 0:
        return None
    if t.nr_throttled == 0:
        return Finding(
            catalogue.ENV_CPU_THROTTLING,
            Severity.OK,
            "no CPU throttling recorded",
            f"0 of {t.nr_periods:,} scheduler periods throttled ({t.path}/cpu.stat).",
        )
    severity = Severity.WARNING if t.share >= 0.01 else Severity.INFO
    workers = recommended_workers(m)  # None only where no CPU count is known at all
    quota = f" under a quota of {m.cpu.quota_cpus:g} CPUs" if m.cpu.quota_cpus else ""
    return Finding(
        catalogue.ENV_CPU_THROTTLED,
        severity,
        f"the CPU quota throttled this cgroup in {t.share:.1%} of scheduler periods",
        f"{t.nr_throttled:,} of {t.nr_periods:,} periods throttled, {t.throttled_s:,.0f} s "
        f"stalled in all{quota} ({t.path}/cpu.stat; counted since the cgroup was created). "
        "A throttled DataLoader worker stops mid-batch until the next 100 ms period.",
        "Raise or remove the CPU limit (Kubernetes: resources.limits.cpu; keep "
        "resources.requests.cpu for scheduling), or run fewer workers than the quota "
        f"(num_workers={workers}) so they are not descheduled mid-batch.",
        fix={} if workers is None else {"num_workers": workers},
    )


def check_shm(m: Machine) -> Finding | None:
    if not m.shm.mounted:
        return Finding(
            catalogue.ENV_SHM_MISSING,
            Severity.WARNING,
            "/dev/shm is not mounted",
            m.unknown.get("shm.size_bytes", "/dev/shm is not in the mount table") + ". "
            "DataLoader workers hand batches to the training process through POSIX shared "
            "memory in /dev/shm.",
            "Mount a tmpfs at /dev/shm (Docker: --shm-size=16g or --ipc=host).",
        )
    size = m.shm.size_bytes
    if size is None:
        return Finding(
            catalogue.ENV_SHM_UNKNOWN,
            Severity.INFO,
            "/dev/shm size could not be read",
            m.unknown.get("shm.size_bytes", ""),
        )
    if size >= SHM_CRITICAL_BYTES:
        free = f", {format_bytes(m.shm.free_bytes)} free" if m.shm.free_bytes is not None else ""
        return Finding(catalogue.ENV_SHM, Severity.OK, f"/dev/shm is {format_bytes(size)}{free}")
    batch = 32 * 3 * 224 * 224 * 4
    return Finding(
        catalogue.ENV_SHM_TOO_SMALL,
        Severity.CRITICAL,
        f"/dev/shm is only {format_bytes(size)}",
        f"/dev/shm ({m.shm.fstype}) holds {format_bytes(size)}. DataLoader workers pass every "
        f"batch through it: one batch of 32 RGB 224x224 float32 images is "
        f"{format_bytes(batch)}, and each worker keeps prefetch_factor (2) batches in flight. "
        'When it fills, workers die with "bus error" ("DataLoader worker (pid N) is killed '
        'by signal: Bus error"). Docker and containerd default to 64 MiB.',
        f"Docker: docker run --shm-size={SHM_SUGGESTED} ... (or --ipc=host). Kubernetes: mount "
        "a memory-backed emptyDir at /dev/shm: volumes: [{name: dshm, emptyDir: {medium: "
        "Memory, sizeLimit: 16Gi}}] and volumeMounts: [{name: dshm, mountPath: /dev/shm}] "
        "(it counts against the pod's memory limit).",
        Gain(GainKind.BLOCKER, basis="multi-worker loading fails once /dev/shm fills"),
    )


def check_memlock(m: Machine) -> Finding | None:
    soft = m.limits.memlock_bytes
    if soft is None:
        if "limits.memlock_bytes" in m.not_applicable:
            return Finding(
                catalogue.ENV_MEMLOCK, Severity.OK, "locked memory (RLIMIT_MEMLOCK) is unlimited"
            )
        return None
    if soft >= MEMLOCK_LOW_BYTES:
        return Finding(
            catalogue.ENV_MEMLOCK, Severity.OK, f"RLIMIT_MEMLOCK is {format_bytes(soft)}"
        )
    hard = m.limits.memlock_hard_bytes
    hard_text = "unlimited" if hard is None else format_bytes(hard)
    return Finding(
        catalogue.ENV_MEMLOCK_LOW,
        Severity.WARNING if m.gpus else Severity.INFO,
        f"locked memory is limited to {format_bytes(soft)} (RLIMIT_MEMLOCK)",
        f"soft {format_bytes(soft)}, hard {hard_text}. Page-locked (pinned) host memory is "
        "what makes host-to-device copies fast and asynchronous; memory registered for RDMA "
        "(NCCL over InfiniBand/RoCE, GPUDirect) is charged against this limit, and at a few "
        "MiB registration fails or NCCL falls back to slower transports. containerd's "
        "default is 8 MiB.",
        "Raise it where the job starts: Docker --ulimit memlock=-1:-1; containerd/Kubernetes: "
        "LimitMEMLOCK=infinity in the containerd service unit; a shell: ulimit -l unlimited "
        "(needs a hard limit that allows it).",
    )


def check_nofile(m: Machine) -> Finding | None:
    soft = m.limits.nofile
    if soft is None:
        return None
    if soft >= NOFILE_LOW:
        return Finding(catalogue.ENV_NOFILE, Severity.OK, f"open files limit is {soft:,}")
    hard = m.limits.nofile_hard
    raise_to = min(65536, hard) if hard is not None else 65536
    can = (
        f"Raise the soft limit where the job starts: ulimit -n {raise_to} (the hard limit, "
        f"{hard:,}, allows it without root)"
        if hard is not None and hard > soft
        else "Raise the hard limit first (Docker: --ulimit nofile=65536:65536)"
    )
    return Finding(
        catalogue.ENV_NOFILE_LOW,
        Severity.WARNING,
        f"only {soft:,} open files allowed (RLIMIT_NOFILE)",
        f"soft limit {soft:,}, hard {'unlimited' if hard is None else f'{hard:,}'}. DataLoader "
        "workers pass each tensor to the training process as a file descriptor (the "
        "file_descriptor sharing strategy, the default on Linux); many workers with deep "
        'prefetch queues run out: "received 0 items of ancdata" or "Too many open files".',
        f"{can}; or torch.multiprocessing.set_sharing_strategy"
        "('file_system') in the training script.",
    )


def check_pids(m: Machine) -> Finding | None:
    pids = m.limits.pids_max
    if pids is None or pids >= PIDS_LOW:
        return None
    return Finding(
        catalogue.ENV_PIDS_LOW,
        Severity.WARNING,
        f"the cgroup allows only {pids:,} tasks (pids.max)",
        f"pids.max = {pids:,}. The limit counts threads, not just processes: every DataLoader "
        "worker is a process with its own threads, and the training process starts dozens.",
        "Raise the limit: Docker --pids-limit=-1 or a larger number; Kubernetes: the "
        "kubelet's podPidsLimit.",
    )


def check_memory_limit(m: Machine) -> Finding | None:
    limit, total = m.memory.limit_bytes, m.memory.total_bytes
    if limit is None or total is None or limit >= total:
        return None
    return Finding(
        catalogue.ENV_MEMORY_LIMIT,
        Severity.INFO,
        f"this cgroup may use {format_bytes(limit)} of the machine's {format_bytes(total)}",
        f"cgroup memory limit {format_bytes(limit)}"
        + (f", {format_bytes(m.memory.usage_bytes)} in use" if m.memory.usage_bytes else "")
        + ". Page cache for the files this cgroup reads is charged to it too, so a dataset "
        "larger than the limit is re-read from storage every epoch, and each DataLoader "
        "worker's copy of the dataset object counts against it.",
        "Keep the dataset index small (numpy arrays, not Python lists of dicts) so workers "
        "share it, and size the limit for workers x per-worker memory plus the page cache "
        "you want.",
    )


CHECKS: tuple[Callable[[Machine], Finding | None], ...] = (
    devices.check_torch_build,
    check_shm,
    check_cpu,
    check_throttling,
    devices.check_numa,
    devices.check_pcie_width,
    devices.check_pcie_gen,
    check_memlock,
    check_nofile,
    check_pids,
    check_memory_limit,
    devices.check_storage,
    devices.check_no_gpu,
)


def advise(m: Machine) -> tuple[Finding, ...]:
    return tuple(f for check in CHECKS if (f := check(m)) is not None)


def rules(results: Results) -> list[Finding]:
    """The machine's facts, judged, when the run includes the env stage."""
    if "env" not in results or results.machine is None:
        return []
    return list(advise(results.machine))
