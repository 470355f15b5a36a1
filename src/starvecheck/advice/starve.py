"""Judging a `starve` sweep: is the GPU starved at num_workers=0, how many workers
this machine needs, whether any count is enough, and what workers past the CPUs do.

Reads the sweep as its record (core/schema/starve.StarveFigures, read from the
metrics by their labels), so a stored report is judged as a fresh one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from starvecheck.advice.workers import Cpus, IdleShares, recommend_workers
from starvecheck.core import catalogue
from starvecheck.core.criteria import IDLE_AS_GOOD
from starvecheck.core.model import Finding, Gain, GainKind, Judged, Severity, StageResult
from starvecheck.core.schema.loader import Recommended
from starvecheck.core.schema.loader import StarveParameters as Parameters
from starvecheck.core.schema.starve import Quantity, StarveFigures

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

STARVED_CRITICAL = 0.50
STARVED_WARNING = 0.10
FED = 0.05  # idle share below which the GPU counts as fed
SLOW_FIRST_BATCH_S = 1.0


def _idle(r: StageResult) -> dict[int, float]:
    return r.records(StarveFigures).idle()


def _value(r: StageResult, quantity: Quantity, workers: int) -> float | None:
    return r.records(StarveFigures).value(quantity, workers)


def recommended(r: StageResult) -> int | None:
    """num_workers from the sweep (advice.workers: the fewest within 2 points of the
    least idle at or below the effective CPUs); None where none was measured there."""
    cpus = Cpus(r.parameters.cpus)
    advice = recommend_workers(IdleShares(_idle(r)), cpus)
    return advice.workers if advice is not None else None


def complete(r: StageResult) -> StageResult:
    """The result as the report carries it: its sweep, with the recommended num_workers
    (made here, when the run is judged; a stored report's made again from its sweep)."""
    rec = recommended(r)
    if rec is None:
        return replace(r, judged=Judged())
    return replace(r, judged=Judged(Recommended(overall=rec).to_metrics()))


def rules(results: Results) -> list[Finding]:
    r = results.get("starve")
    if r is None:
        return []
    idle = _idle(r)
    if not idle:
        return []
    params = r.parameters.read(Parameters)
    cpus = params.cpus
    quota = results.machine.cpu.quota_cpus if results.machine is not None else None
    said = cpus_text(cpus, quota)
    d, b, g = params.sample_ms, params.batch_size, params.step_ms
    measured = r.records(StarveFigures).sample_cpu_ms
    d = (measured.value if measured is not None else None) or d
    rec = recommended(r)
    findings = [
        _workers_zero(r, idle, rec),
        _enough(idle, rec, said, d, b, g, quota or cpus),
        _above_cpus(r, idle, cpus, said, rec),
        _first_batch(r, rec),
        _pin_memory(params, rec),
    ]
    return _simulated([f for f in findings if f is not None], params)


def _simulated(findings: list[Finding], params: Parameters) -> list[Finding]:
    """On a workload the user did not give (default --sample-ms, --step-ms), findings
    are about a simulation: at most a warning, and the title and evidence say so."""
    assumed = params.assumed
    if not assumed:
        return findings
    given = {"sample_ms": "--sample-ms", "step_ms": "--step-ms"}
    what = ", ".join(f"{given[k]} {params[k]:g}" for k in assumed if k in given)
    note = (
        f" Simulated: {what} (defaults, not your workload); give your own per-sample CPU "
        "cost and step time to judge your job."
    )
    out = []
    for f in findings:
        severity = min(f.severity, Severity.WARNING, key=lambda x: x.rank)
        title = f.title if f.severity is Severity.OK else f"{f.title} (simulated workload)"
        out.append(replace(f, severity=severity, title=title, evidence=f.evidence + note))
    return out


def cpus_text(cpus: int, quota: float | None) -> str:
    """'2 effective CPUs', or with a quota below it, '1 effective CPU (a 0.5-CPU cgroup
    quota: half a core's time)': workers count whole CPUs, the quota is what they get."""
    text = f"{cpus} effective CPU{'s' if cpus != 1 else ''}"
    if quota is not None and quota < cpus:
        text += f" (a {quota:g}-CPU cgroup quota: {quota:g} of a core's time per second)"
    return text


def _dataloader_line(w: int) -> str:
    return (
        f"`DataLoader(dataset, batch_size=..., num_workers={w}, pin_memory=True, "
        f"persistent_workers={w > 0}, prefetch_factor={2 if w else None})`"
    )


def _workers_zero(r: StageResult, idle: dict[int, float], rec: float | None) -> Finding | None:
    if 0 not in idle or rec is None:
        return None
    wait0 = _value(r, Quantity.WAIT_MS, 0)
    w0, wr, n = idle[0], idle.get(int(rec), idle[0]), int(rec)
    evidence = (
        "num_workers=0: the GPU "
        + (f"waits {wait0:,.0f} ms per step, " if wait0 is not None else "")
        + f"idle {w0:.0%} of the time; "
        f"num_workers={n}: idle {wr:.0%}"
    )
    if n == 0 and w0 >= STARVED_WARNING:
        # No worker count beats num_workers=0: nothing to compare it with (the
        # not-enough-cpu finding says why workers do not help).
        return None
    if w0 < STARVED_WARNING:
        return Finding(
            catalogue.STARVE_WORKERS_ZERO,
            Severity.OK,
            f"Even num_workers=0 keeps the GPU fed ({w0:.0%} idle)",
            evidence,
            stage="starve",
        )
    # Ranked by what the workers recover, not by the idle at 0: where the CPU is the
    # limit, one worker buys little and the not-enough-cpu finding says why.
    recovered = max(0.0, w0 - wr)
    return Finding(
        catalogue.STARVE_WORKERS_ZERO,
        Severity.CRITICAL
        if recovered >= STARVED_CRITICAL
        else Severity.WARNING
        if recovered >= STARVED_WARNING
        else Severity.INFO,
        f"num_workers=0 leaves the GPU idle {w0:.0%} of each step",
        evidence,
        f"Load in worker processes: {_dataloader_line(n)}.",
        Gain(
            GainKind.STEP_SHARE,
            round(max(0.0, w0 - wr), 3),
            f"idle share at num_workers=0 minus at {n}, measured here",
        ),
        stage="starve",
        fix={"num_workers": n},
    )


def _enough(
    idle: dict[int, float],
    rec: float | None,
    cpus_said: str,
    d: float | None,
    b: int | None,
    g: float | None,
    cpu_time: float,
) -> Finding | None:
    if rec is None or int(rec) not in idle or d is None or b is None or g is None:
        return None
    r = int(rec)
    best = idle[r]
    need = d * b / g if g > 0 else float("inf")
    evidence = (
        f"each batch costs {d:g} ms x {b} = {d * b:,.0f} ms of CPU; the step takes {g:g} ms, "
        f"so keeping up needs {need:.1f} CPUs of preprocessing; {cpus_said} here; "
        f"best measured: {best:.0%} idle at num_workers={r}"
    )
    if best <= FED:
        return Finding(
            catalogue.STARVE_WORKERS_NEEDED,
            Severity.OK,
            f"num_workers={r} keeps the GPU fed ({best:.0%} idle)",
            evidence + f"; use {_dataloader_line(r)}",
            stage="starve",
            fix={"num_workers": r},
        )
    return Finding(
        catalogue.STARVE_NOT_ENOUGH_CPU,
        Severity.CRITICAL if best >= STARVED_CRITICAL else Severity.WARNING,
        f"No worker count is enough here: the GPU stays {best:.0%} idle",
        evidence,
        f"Preprocessing needs {need:.1f} CPUs and this machine gives {cpu_time:g}: more "
        "workers only compete for them. Pre-tokenize or pre-decode offline (store token ids "
        "in shards), make transforms cheaper, move augmentation to the GPU, or run on a node "
        f"with at least {int(need) + 1} CPUs per GPU.",
        Gain(
            GainKind.STEP_SHARE,
            round(best, 3),
            "the idle share left at the best worker count, measured here",
        ),
        stage="starve",
    )


def _above_cpus(
    r: StageResult, idle: dict[int, float], cpus: int, cpus_said: str, rec: float | None
) -> Finding | None:
    over = [w for w in idle if w > cpus]
    at = [w for w in idle if 0 < w <= cpus]
    if not over or not at:
        return None
    w_at, w_over = max(at), max(over)
    gained = idle[w_at] - idle[w_over]
    step_at, step_over = _step_ms(r, w_at), _step_ms(r, w_over)
    if step_at and step_over:
        # Judged by the step, not the idle share: a throttled quota slows the training
        # process too, and a longer step reads as less idle without one more sample.
        gained = min(gained, 1 - step_over / step_at)
    pred = _value(r, Quantity.PREDICTED_WAIT_MS, w_over)
    naive = _value(r, Quantity.SLEEP_MODEL_WAIT_MS, w_over)
    waited = _value(r, Quantity.WAIT_MS, w_over)
    evidence = (
        f"num_workers={w_at}: {idle[w_at]:.0%} idle; num_workers={w_over}: {idle[w_over]:.0%} "
        f"idle, {waited:,.0f} ms wait per step (CPU-aware model {pred:,.0f} ms; a sleep-based "
        f"model would promise {naive:,.0f} ms)"
    )
    if gained > IDLE_AS_GOOD:
        # Measured, and against the CPU arithmetic: said as an observation, never as a
        # "Passed" beside a recommendation of fewer workers.
        return Finding(
            catalogue.STARVE_WORKERS_ABOVE_CPUS,
            Severity.INFO,
            f"{w_over} workers left the GPU {gained:.0%} less idle than {w_at} on {cpus_said}",
            evidence + "; CPU-bound work should not gain past the CPUs: the simulated "
            "per-sample work waits as well as computes here, or the quota's periods let "
            "bursts through",
            f"Try num_workers={w_over} in your own loop under `starvecheck.watch` before "
            "keeping it: workers past the CPUs take time from the training process.",
            Gain(GainKind.STEP_SHARE, None, "measured in the simulation only"),
            stage="starve",
        )
    keep = int(rec) if rec is not None and int(rec) <= cpus else w_at
    return Finding(
        catalogue.STARVE_WORKERS_ABOVE_CPUS,
        Severity.WARNING,
        f"{w_over} workers are no better than {w_at}: this machine has {cpus_said}",
        evidence,
        f"Set num_workers to at most {cpus} (the effective CPUs: affinity and cgroup quota, "
        "not os.cpu_count()); extra workers only add memory and start-up time.",
        Gain(GainKind.STEP_SHARE, None, "no throughput; saves memory and worker start-up"),
        stage="starve",
        fix={"num_workers": keep},
    )


def _step_ms(r: StageResult, workers: int) -> float | None:
    wait = _value(r, Quantity.WAIT_MS, workers)
    compute = _value(r, Quantity.COMPUTE_MS, workers)
    return wait + compute if wait is not None and compute is not None else None


def _first_batch(result: StageResult, rec: float | None) -> Finding | None:
    if not rec:
        return None
    r = int(rec)
    first = _value(result, Quantity.FIRST_BATCH_S, r)
    if first is None or first < SLOW_FIRST_BATCH_S:
        return None
    return Finding(
        catalogue.STARVE_FIRST_BATCH_SLOW,
        Severity.INFO,
        f"The first batch takes {first:.1f} s with {r} workers",
        f"time to the first batch at num_workers={r}: {first:.2f} s (worker start-up and "
        "the first prefetch), paid again at every epoch without persistent workers",
        "Keep workers between epochs: `DataLoader(..., persistent_workers=True)`.",
        Gain(GainKind.STEP_SHARE, None, "per epoch: depends on steps per epoch"),
        stage="starve",
    )


def _pin_memory(params: Parameters, rec: float | None) -> Finding | None:
    """Only where there is a GPU to copy to: without CUDA, pinning does not apply."""
    if not params.cuda or not rec:
        return None
    return Finding(
        catalogue.STARVE_PIN_MEMORY,
        Severity.INFO,
        "Batches here are pageable: pin them so the copy to the GPU can overlap",
        "this run hands batches over without pin_memory; with a CUDA device, pageable "
        "host memory is staged through a bounce buffer and `.to(device, non_blocking=True)` "
        "cannot overlap with compute",
        "`DataLoader(..., pin_memory=True)` and `batch.to(device, non_blocking=True)`.",
        Gain(GainKind.STEP_SHARE, None, "`starvecheck pcie` measures pinned vs pageable"),
        stage="starve",
    )
