"""How many DataLoader workers: the one entry point for every recommendation of
num_workers, `recommend_workers(evidence, cpus)`, whatever the evidence:

- a sweep's measured curve: loader's samples/s by num_workers (`Throughput`: the
  fewest workers within 5% of the best) or starve's GPU idle share (`IdleShares`: the
  fewest within 2 points of the least idle), each at or below the effective CPUs
  (core/criteria.py: the same rules the stages measure by);
- a loop's timing (`Loop`: profile --trace, watch, attach), by the loop model;
- nothing measured (`None`: env): the effective CPUs per training process, less one
  for the process itself.

The loop model and its bounds by the machine: advice/loopmodel.py and
advice/machinebound.py (re-exported here: `Loop`, `Forecast`, `WorkerAdvice`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from starvecheck.advice.loopmodel import Forecast, Loop, WorkerAdvice, loop_advice
from starvecheck.advice.machinebound import MEASURED_PATH
from starvecheck.core.criteria import knee, least_idle, paired_knee

__all__ = [
    "MEASURED_PATH",
    "Cpus",
    "Evidence",
    "Forecast",
    "IdleShares",
    "Loop",
    "Throughput",
    "WorkerAdvice",
    "recommend_workers",
]


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
    # Each count's figures in round order, where the counts were read in interleaved
    # rounds: then the counts are compared round by round (core/criteria.paired_knee).
    rounds: Mapping[int, Sequence[float]] | None = None


@dataclass(frozen=True)
class IdleShares:
    """starve's sweep: the GPU's idle share by num_workers."""

    curve: Mapping[int, float]


Evidence = Throughput | IdleShares | Loop | None


def recommend_workers(evidence: Evidence, cpus: Cpus) -> WorkerAdvice | None:
    """num_workers from what was measured (see the module docstring); None where the
    evidence recommends nothing: no count measured at or below the CPUs, no wait or no
    step to compare with, or the CPUs unknown with nothing measured."""
    if isinstance(evidence, Loop):
        return loop_advice(evidence, cpus.effective)
    if isinstance(evidence, Throughput | IdleShares):
        return _sweep(evidence, cpus.effective or 1)
    if cpus.effective is None:
        return None
    workers = max(1, int(cpus.effective) // max(1, cpus.processes) - 1)
    per = f" per process ({cpus.processes} share them)" if cpus.processes > 1 else ""
    why = f"{cpus.effective:g} effective CPUs{per}, less one for the training process"
    return WorkerAdvice(workers, why)


def _sweep(evidence: Throughput | IdleShares, effective: float) -> WorkerAdvice | None:
    if isinstance(evidence, Throughput):
        rounds = evidence.rounds
        waits = evidence.cpu_work is False and bool(evidence.curve)
        limit = max(evidence.curve) if waits else effective
        k = paired_knee(rounds, limit) if rounds else knee(evidence.curve, limit)
        fewest = (
            "the fewest workers shown as good as the best samples/s, round by round "
            "(within 5%, its 90% interval above 0.90x; counts the rounds cannot tell "
            "apart settled towards more workers),"
            if rounds
            else "the fewest workers within 5% of the best samples/s"
        )
        if waits:
            rule = (
                f"{fewest.rstrip(',')}; the workers are "
                "measured blocked (I/O, sleep), not on a CPU nor waiting for one, so counts "
                f"past the {effective:g} effective CPUs count"
            )
            return None if k is None else WorkerAdvice(k, rule)
        rule = fewest
    else:
        k = least_idle(evidence.curve, effective)
        rule = "the fewest workers within 2 points of the least GPU idle"
    if k is None:
        return None
    return WorkerAdvice(k, f"{rule} at or below {effective:g} effective CPUs")
