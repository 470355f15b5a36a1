"""How many DataLoader workers: the one entry point for every recommendation of
num_workers, `recommend_workers(evidence, cpus)`, whatever the evidence:

- a sweep's measured curve: loader's samples/s by num_workers (`Throughput`: the
  fewest workers within 5% of the best) or starve's GPU idle share (`IdleShares`: the
  fewest within 2 points of the least idle), each at or below the effective CPUs
  (criteria.py: the same rules the stages measure by);
- a loop's timing (`Loop`: profile --trace, watch), by the model below;
- nothing measured (`None`: env): the effective CPUs per training process, less one
  for the process itself.

The loop model. At num_workers=0 the training process makes each batch itself: it
waits W ms for a batch, of which C ms are CPU work (the rest waits on storage or
sleeps), then runs the step for R ms. With k workers, batches arrive every
max(W / k, C / A) ms, where A is the CPU the workers can have: the effective CPUs
(affinity and cgroup quota, a fraction included) less what the training process
itself burns during its step. The step then takes max(R, that interval). So:

- waiting on I/O (C small against W): more workers than cores help, up to W / R;
- CPU work (C close to W): never more workers than A, and when C / A > R no worker
  count keeps up: the loader is CPU-bound, and the fix is to do the work once,
  offline (pre-tokenize, pre-decode), not more workers.

A loop that already has k0 workers and still waits shows a step of S ms, which is
then the interval at which its workers deliver: each worker takes W = k0 * S to make a
batch, and C is the workers' own CPU time per batch (watch reads it from the worker
processes). The same arithmetic then says how many workers keep up, and the speed-up
is S over the predicted step. With the CPUs unknown (a trace of another machine),
W / R workers keep level, one spare, and no forecast is made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from starvecheck.criteria import knee, least_idle

# CPU work is this share of the wait or more: the loader is doing CPU work.
CPU_WORK_SHARE = 0.5
# Below this share of a core, the training step's own CPU is left out of the count.
NEGLIGIBLE_SHARE = 0.1


@dataclass(frozen=True)
class Cpus:
    """The CPUs num_workers is sized against."""

    effective: float | None  # affinity and cgroup quota (a fraction included); None: unknown
    processes: int = 1  # training processes that share them (one per GPU)


@dataclass(frozen=True)
class Throughput:
    """loader's sweep: samples/s by num_workers, in one layout and cache state.
    `cpu_work`: whether the workers' wait is CPU work (measured: `loader --factory`
    reads the workers' CPU time); None: not measured, taken as CPU work, the safe side.
    Only where it is measured not to be (workers waiting on I/O or sleeping) may the
    recommendation go past the CPUs."""

    curve: Mapping[int, float]
    cpu_work: bool | None = None


@dataclass(frozen=True)
class IdleShares:
    """starve's sweep: the GPU's idle share by num_workers."""

    curve: Mapping[int, float]


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


Evidence = Throughput | IdleShares | Loop | None


@dataclass(frozen=True)
class Forecast:
    """What the loop model predicts with the recommended workers."""

    step_ms: float  # the predicted step
    speedup: float  # today's step over the predicted one
    available_cpus: float  # A: CPU the workers can have
    cpu_bound: bool  # no worker count keeps up: the CPU needed exceeds the CPU there is
    cpu_work: bool  # the wait is mostly CPU work (not I/O or sleep)


@dataclass(frozen=True)
class WorkerAdvice:
    workers: int
    why: str  # the rule or the arithmetic, in words
    workers_now: int = 0
    forecast: Forecast | None = None  # a loop's, where its CPUs are known

    @property
    def changes(self) -> bool:
        return self.workers != self.workers_now


def recommend_workers(evidence: Evidence, cpus: Cpus) -> WorkerAdvice | None:
    """num_workers from what was measured (see the module docstring); None where the
    evidence recommends nothing: no count measured at or below the CPUs, no wait or no
    step to compare with, or the CPUs unknown with nothing measured."""
    if isinstance(evidence, Loop):
        return _loop(evidence, cpus.effective)
    if isinstance(evidence, Throughput | IdleShares):
        return _sweep(evidence, cpus.effective or 1)
    if cpus.effective is None:
        return None
    workers = max(1, int(cpus.effective) // max(1, cpus.processes) - 1)
    per = f" per process ({cpus.processes} share them)" if cpus.processes > 1 else ""
    why = f"{cpus.effective:g} effective CPUs{per}, less one for the training process"
    return WorkerAdvice(workers, why)


def _sweep(evidence: Throughput | IdleShares, effective: float) -> WorkerAdvice | None:
    if isinstance(evidence, Throughput) and evidence.cpu_work is False and evidence.curve:
        k = knee(evidence.curve, max(evidence.curve))
        rule = (
            "the fewest workers within 5% of the best samples/s; the workers wait on I/O, "
            "not the CPU (their CPU time measured), so counts past the "
            f"{effective:g} effective CPUs count"
        )
        return None if k is None else WorkerAdvice(k, rule)
    if isinstance(evidence, Throughput):
        k = knee(evidence.curve, effective)
        rule = "the fewest workers within 5% of the best samples/s"
    else:
        k = least_idle(evidence.curve, effective)
        rule = "the fewest workers within 2 points of the least GPU idle"
    if k is None:
        return None
    return WorkerAdvice(k, f"{rule} at or below {effective:g} effective CPUs")


def _loop(loop: Loop, effective_cpus: float | None) -> WorkerAdvice | None:
    wait_ms, rest_ms, workers_now = loop.wait_ms, loop.rest_ms, loop.workers_now
    if wait_ms <= 0 or rest_ms <= 0:
        return None
    step_now = wait_ms + rest_ms
    if workers_now > 0:  # each worker takes k0 steps to make its batch
        wait_ms = workers_now * step_now
    keep_up = math.ceil(wait_ms / rest_ms)  # workers that hide the latency
    if effective_cpus is None:
        why = f"a batch takes {wait_ms:,.1f} ms to load and the rest of the step {rest_ms:,.1f} ms"
        return WorkerAdvice(max(1, workers_now, keep_up + 1), why, workers_now)
    wait_cpu = loop.wait_cpu_ms
    cpu_ms = wait_ms if wait_cpu is None else min(max(wait_cpu, 0.0), wait_ms)
    train_share = min(max(loop.step_cpu_ms / rest_ms, 0.0), 1.0)
    if train_share < NEGLIGIBLE_SHARE:  # a step that waits on the GPU: its CPU is noise
        train_share = 0.0
    available = max(1.0, effective_cpus - train_share)
    cpu_work = cpu_ms >= CPU_WORK_SHARE * wait_ms
    # Past this many workers the CPU, not the count, limits the batches.
    cpu_cap = max(1, math.floor(min(available * wait_ms / cpu_ms, 1e6))) if cpu_ms > 0 else 10**6
    workers = min(keep_up + 1, cpu_cap)  # one spare where the CPU allows it
    workers = max(1, workers_now, workers)

    def interval(k: int) -> float:
        return max(wait_ms / k, cpu_ms / available)

    step = max(rest_ms, interval(workers))
    cpu_bound = cpu_ms / available > rest_ms
    speedup = max(1.0, step_now / step)
    made = (
        f"each of the {workers_now} worker(s) takes {wait_ms:,.1f} ms to make a batch "
        f"({workers_now} x the {step_now:,.1f} ms step)"
        if workers_now
        else f"a batch takes {wait_ms:,.1f} ms to make in the training process"
    )
    why = (
        f"{made}, {cpu_ms:,.1f} ms of it CPU work; the rest of the step takes {rest_ms:,.1f} ms; "
        f"{available:.1f} CPU(s) are free for workers ({effective_cpus:.1f} effective"
        + (f", less {train_share:.1f} the training step uses" if train_share >= 0.05 else "")
        + ")"
    )
    forecast = Forecast(step, speedup, available, cpu_bound, cpu_work)
    return WorkerAdvice(workers, why, workers_now, forecast)
