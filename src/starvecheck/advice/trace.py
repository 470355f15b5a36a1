"""Judging a trace read by `profile --trace`: how much of each step waits for data,
how much the GPU sits idle for other reasons, what copies cost, and whether the
first step stalled.

Reads the breakdown's figures as their record (core/schema/steps.StepFigures: the
headline's data_wait_share, step_ms, gpu_idle_other_share, ...), read alike from a
fresh result and a stored report. Thresholds as HolisticTraceAnalysis
and the PyTorch profiler guides use them: data wait above 5% of the step is
input-bound, above 20% highly input-bound.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starvecheck.advice import loadstages
from starvecheck.advice.loadstages import Waits
from starvecheck.advice.profile import INPUT_BOUND, few_steps, severity
from starvecheck.advice.stepworkers import (
    EITHER,
    LOADER_LINE,
    SINGLE_PROCESS,
    Restarts,
    measured_advice,
    prediction_interval,
    single_process,
    worker_change,
    workers_needed,
)
from starvecheck.advice.stragglers import WAITING, among_ranks
from starvecheck.core import catalogue
from starvecheck.core.metric import Caveat
from starvecheck.core.model import Finding, Gain, GainKind, Judged, Severity, StageResult
from starvecheck.core.paired import MARGIN, Comparison
from starvecheck.core.schema.loading import LoadFigures
from starvecheck.core.schema.steps import HTA_PARTS, Parameters, Run, Step, StepFigures

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

GPU_IDLE = 0.20  # GPU idle share worth a finding, when data wait does not explain most of it
GPU_IDLE_CRITICAL = 0.50  # idle for other reasons over half the step
MEMCPY = 0.10
FIRST_STEP_STALL = 3.0  # first step over the median of the rest


# Quiet below this: a wait under a millisecond a step.
QUIET_WAIT_MS = 1.0
OTHER_RUNS_SAID = 5  # other runs in a folder said one by one; the rest counted


def complete(r: StageResult) -> StageResult:
    """A trace's result as the report carries it: where its files hold other runs
    than the one analysed, each one's headline said (`trace.other-runs`), from the
    figures the stage recorded of it."""
    runs = r.parameters.read(Parameters).runs
    others = [_other_run(i, run) for i, run in enumerate(runs[1 : OTHER_RUNS_SAID + 1], start=2)]
    if len(runs) > OTHER_RUNS_SAID + 1:
        others.append(f"and {len(runs) - OTHER_RUNS_SAID - 1} more runs")
    said = Caveat("trace.other-runs", "; ".join(others))
    if not others or said in r.caveats:
        return r
    return replace(r, judged=Judged(caveats=(said,)))


def _other_run(i: int, run: Run) -> str:
    if run.error:
        return f"run {i} could not be analysed: {run.error}"
    share, rank = run.data_wait_share, run.headline_rank
    wait = f"{share:.0%}" if share is not None else "an unknown share"
    who = f"{rank} waits most for data: " if rank else ""
    return f"run {i} on its own: {who}{wait} of a {run.step_ms or 0:,.1f} ms step"


def rules(results: Results) -> list[Finding]:
    """A step breakdown: a trace of another run (`profile --trace`, the `trace` stage),
    or a loop as `starvecheck.watch` timed it. The findings of both are this module's,
    stamped `trace` (under `profile` in the JSON, as they always were)."""
    found: list[Finding] = []
    for stage in ("trace", "watch"):
        r = results.get(stage)
        if r is not None:
            params = r.parameters.read(Parameters)
            figures = r.records(StepFigures).headline()
            found += _breakdown(figures, params, loadstages.of(r.records(LoadFigures)))
            found += among_ranks(r.records(StepFigures), WAITING.get(params.rank_wait_source or ""))
    return found


def _breakdown(m: StepFigures, params: Parameters, split: Waits | None) -> list[Finding]:
    findings = [_data_bound(m, params, split), _gpu_idle(m), _memcpy(m), _first_step(m)]
    return [f for f in findings if f is not None]


def steps_waiting(m: StepFigures) -> tuple[int, int] | None:
    """(steps whose own data wait is over 5% of them, steps measured), from the
    per-step values of data_wait_ms and step_ms."""
    wait, step = m.measured(Step.DATA_WAIT_MS), m.measured(Step.STEP_MS)
    if wait is None or step is None or not step.values or wait.n != step.n:
        return None
    over = sum(
        1 for w, s in zip(wait.values, step.values, strict=True) if s > 0 and w / s > INPUT_BOUND
    )
    return over, step.n


@dataclass(frozen=True)
class DataWait:
    """What a step breakdown says of its wait for data: the detection behind
    `profile.data-bound`, apart from the words it is said in."""

    share: float  # summed wait over summed step time
    severity: Severity  # lowered for a wait too small to matter or too few steps
    kind: str  # the title's words, from the share alone
    wait_ms: float | None  # means of the same steps: the three figures add up
    step_ms: float | None
    waiting: tuple[int, int] | None  # (steps waiting over INPUT_BOUND, steps measured)
    steps: int  # steps measured
    quiet: bool  # under QUIET_WAIT_MS a step: nothing a loader change would buy
    few: str  # why the severity was lowered for too few steps, or ""


def data_wait(m: StepFigures) -> DataWait | None:
    share = m.value_of(Step.DATA_WAIT_SHARE)
    if share is None:
        return None
    sev = severity(share)
    # The title's words follow the share; the severity may be lowered below (a short
    # trace, a wait too small to matter), and the evidence says why.
    kind = "highly input-bound" if sev is Severity.CRITICAL else "moderately input-bound"
    wait_ms, step_ms = m.mean(Step.DATA_WAIT_MS), m.mean(Step.STEP_MS)
    steps = m.measured(Step.STEP_MS)
    n = steps.n if steps is not None else 0
    quiet = sev is not Severity.OK and wait_ms is not None and wait_ms < QUIET_WAIT_MS
    few = ""
    if quiet:
        sev = Severity.INFO
    else:
        sev, few = few_steps(n, sev)
    return DataWait(share, sev, kind, wait_ms, step_ms, steps_waiting(m), n, quiet, few)


def _data_wait_evidence(d: DataWait, params: Parameters) -> str:
    evidence = f"{d.share:.1%} of step time waits for data"
    rank, ranks = params.headline_rank, params.ranks
    if rank is not None and ranks:
        evidence = f"on {rank}, of {len(ranks)} ranks the one that waits most: " + evidence
    if d.wait_ms is not None and d.step_ms is not None:
        evidence += f" (a mean {d.wait_ms:,.1f} ms of a mean {d.step_ms:,.1f} ms step)"
    if d.waiting is not None:
        evidence += f"; {d.waiting[0]} of {d.waiting[1]} steps wait more than {INPUT_BOUND:.0%}"
    evidence += f"; under {QUIET_WAIT_MS:g} ms of wait per step" if d.quiet else d.few
    source, loader = params.data_wait_source, params.dataloader
    if source or loader:
        evidence += f"; measured from {source or 'DataLoader.__next__'}" + (
            f" ({loader})" if loader else ""
        )
    return evidence + "."


def _data_bound_fix(
    d: DataWait, m: StepFigures, params: Parameters, split: Waits | None
) -> tuple[str, Gain, dict[str, Any]]:
    """(recommendation, gain, fix): the fix for the stage that holds the step back where
    the wait was split and no worker count reaches it (advice/loadstages.py); else the
    measured worker change where the loop's figures allow one; else what to look at."""
    if split is not None:
        stage = loadstages.startup_fix(
            split, d.step_ms, params.num_workers, params.start_method
        ) or loadstages.handover_fix(
            split,
            m.value_of(Step.BATCH_BYTES),
            d.step_ms,
            m.mean(Step.COMPUTE_MS),
            params.num_workers,
            loadstages.LoopThread(
                m.mean(Step.DATA_WAIT_CPU_MS) or 0.0,
                m.mean(Step.COMPUTE_CPU_MS) or 0.0,
                m.mean(Step.COMPUTE_RUNQUEUE_MS) or 0.0,
            ),
        )
        if stage is not None:
            return stage
    gain = Gain(
        GainKind.STEP_SHARE,
        round(d.share, 4),
        "data wait inside the steps: what a loader that keeps ahead of the step recovers",
    )
    restarts = Restarts(
        loadstages.start_each_ms(split, params.num_workers, m.value_of(Step.WORKER_START_MS)),
        split.later_pass_steps if split is not None else None,
    )
    advice = measured_advice(m, params, d.wait_ms, d.step_ms, restarts)
    if advice is not None:
        interval = prediction_interval(m, params, restarts) if advice.changes else None
        if interval is not None and not interval.clears():
            return _inside_noise(advice.workers, interval), gain, {}
        share = gain
        recommendation, gain, fix = worker_change(advice, interval)
        if gain.value is None and gain.kind is GainKind.THROUGHPUT:
            # No worker figure (the machine too busy, the bound too wide): the measured
            # wait still says what loading that kept up would give back. The basis
            # starts as a withheld figure's does ("no figure: why").
            gain = replace(share, basis=f"{gain.basis}; {share.basis}")
        sharing = params.ranks_on_host
        if isinstance(sharing, int) and sharing > 1 and gain.value:
            # Measured: two ranks on two cores reached 1.2x of a predicted 1.46x, 3.2x of
            # 4.85x (docs/performance.md): their workers and steps contend for the CPUs.
            basis = (
                f"{gain.basis}; an upper bound: {sharing} ranks share this host's CPUs, and "
                "their workers and steps contend for them, which the model leaves out"
            )
            gain = replace(gain, basis=basis)
        return recommendation, gain, fix
    if params.dataloader == SINGLE_PROCESS:
        wait_ms, step_ms = d.wait_ms, d.step_ms
        k = None if wait_ms is None or step_ms is None else workers_needed(wait_ms, step_ms)
        fix = {"num_workers": k} if k is not None else {}
        return single_process(k, wait_ms, step_ms), gain, fix
    return (
        "Find the slow link: `starvecheck loader` (num_workers and file layout), "
        "`starvecheck starve` (CPU preprocessing per sample), `starvecheck io` "
        "(storage, cold cache); for text, `starvecheck pad` (padding). Keep the loader "
        f"ahead of the step: {LOADER_LINE.format(n='N')}, {EITHER}.",
        gain,
        {},
    )


def _inside_noise(workers: int, interval: Comparison) -> str:
    return (
        f"No worker count clears the noise of this loop: the model predicts num_workers="
        f"{workers} at {interval.describe().replace(' rounds', ' blocks of steps')}, and a "
        f"change is recommended only where that interval is above {1 + MARGIN:.2f}x. "
        "`starvecheck loader --factory FILE.py:FUNC` measures your pipeline at each "
        "num_workers side by side."
    )


def _data_bound(m: StepFigures, params: Parameters, split: Waits | None) -> Finding | None:
    d = data_wait(m)
    if d is None:
        return None
    evidence = _data_wait_evidence(d, params)
    if split is not None and d.severity is not Severity.OK:
        evidence += f" {loadstages.sentence(split)}."
    if d.severity is Severity.OK:
        return Finding(
            catalogue.PROFILE_DATA_BOUND,
            Severity.OK,
            catalogue.PROFILE_DATA_BOUND.title("fed", share=d.share, where=""),
            evidence=evidence,
            recommendation="The input keeps up; step time is compute. For text, "
            "`starvecheck pad` shows how much of that compute goes on padding.",
            gain=Gain(GainKind.STEP_SHARE, round(d.share, 4), "data wait inside the steps"),
            stage="trace",
        )
    recommendation, gain, fix = _data_bound_fix(d, m, params, split)
    evidence, gain = _on_the_device(m, evidence, gain)
    n = d.steps
    return Finding(
        catalogue.PROFILE_DATA_BOUND,
        d.severity,
        catalogue.PROFILE_DATA_BOUND.title(
            "bound",
            whose="The training step is",
            kind=d.kind,
            share=d.share,
            each="it",
            more=f"; only {n} step{'s' if n > 1 else ''} measured" if d.few else "",
        ),
        evidence=evidence,
        recommendation=recommendation,
        gain=gain,
        stage="trace",
        fix=fix,
    )


def _on_the_device(m: StepFigures, evidence: str, gain: Gain) -> tuple[str, Gain]:
    """watch's own GPU figures beside the host's wait: the GPU's idle time waiting for
    data on its own clock (CUDA events), and the headspace replay's step with no data
    wait, which makes the gain of fixing the data path a measured ceiling."""
    device = m.value_of(Step.GPU_IDLE_DATA_WAIT_SHARE)
    if device is not None and m.measured(Step.GPU_STEP_MS) is not None:
        evidence += (
            f" On the GPU's own clock (CUDA events, never synchronizing) it sat idle "
            f"waiting for data {device:.1%} of its step time."
        )
    floor, step = m.mean(Step.HEADSPACE_STEP_MS), m.mean(Step.STEP_MS)
    replayed = m.measured(Step.HEADSPACE_STEP_MS)
    if floor is None or step is None or floor <= 0 or replayed is None:
        return evidence, gain
    ceiling = max(1.0, step / floor)
    evidence += (
        f" With its data already in memory (headspace: {len(replayed.values)} steps "
        f"replayed on batches already fetched) the step takes {floor:,.1f} ms against "
        f"{step:,.1f} ms: fixing the data path gains {ceiling:.2f}x at most, measured."
    )
    basis = f"measured: the step with no data wait (headspace) against the step now, {ceiling:.2f}x"
    if gain.kind is GainKind.THROUGHPUT and gain.value is not None and gain.value <= ceiling:
        return evidence, replace(gain, basis=f"{gain.basis}; within the {basis}")
    return evidence, Gain(GainKind.THROUGHPUT, round(ceiling, 2), basis)


def _gpu_idle(m: StepFigures) -> Finding | None:
    idle = m.value_of(Step.GPU_IDLE_SHARE)
    if idle is None or idle <= GPU_IDLE:
        return None
    # gpu_idle_host_wait_share: its name in reports before 0.2 (the same figure).
    waiting = m.value_of(Step.GPU_IDLE_DATA_WAIT_SHARE)
    if waiting is None:
        waiting = m.value_of(Step.GPU_IDLE_HOST_WAIT_SHARE)
    other = m.value_of(Step.GPU_IDLE_OTHER_SHARE)
    if other is None:  # no fetch in the trace: nothing explains the idle time
        other = idle
    if other <= idle / 2:
        return None  # mostly waiting for data: profile.data-bound says it
    evidence = f"the GPU is idle {idle:.1%} of step time"
    if waiting is not None:
        evidence += f": {waiting:.1%} while the loop waits for data, {other:.1%} otherwise"
    else:
        evidence += " (no DataLoader fetch in the trace to set data wait apart)"
    hta = [m.value_of(q) for q in HTA_PARTS]
    if all(x is not None for x in hta):
        evidence += (
            f"; HolisticTraceAnalysis's idle split (per stream, whole trace) says host wait "
            f"{hta[0]:.0%}, kernel wait {hta[1]:.0%}, other {hta[2]:.0%} of the idle time"
        )
    sev, few = _few_steps(m, Severity.CRITICAL if other > GPU_IDLE_CRITICAL else Severity.WARNING)
    return Finding(
        catalogue.PROFILE_GPU_IDLE,
        sev,
        f"The GPU sits idle {other:.0%} of each step, and not for data",
        evidence=evidence + few + ".",
        recommendation=(
            "Look at what the host runs in the GPU's gaps (the trace in TensorBoard or "
            "https://ui.perfetto.dev). Usual causes: calls that synchronise every step "
            "(`loss.item()`, `.cpu()`, `print(tensor)`, `torch.cuda.synchronize()`): log "
            "every N steps instead; many small kernels that take longer to launch than to "
            'run: `torch.compile(model)` (`mode="reduce-overhead"` adds CUDA graphs) or a '
            "larger batch; Python work between steps (metrics, logging, checkpoints)."
        ),
        gain=Gain(
            GainKind.STEP_SHARE,
            round(other, 4),
            "GPU idle time not spent waiting for data; at most, as some host work cannot overlap",
        ),
        stage="trace",
    )


def _few_steps(m: StepFigures, sev: Severity) -> tuple[Severity, str]:
    """`few_steps` over a breakdown's measured steps."""
    steps = m.measured(Step.STEP_MS)
    return few_steps(steps.n if steps is not None else 0, sev)


def _memcpy(m: StepFigures) -> Finding | None:
    """Host <-> device copies. Device-to-device copies stay on the GPU (no loader or
    pinning setting changes them): counted apart. Pinning is advised only where some
    host-to-device copy comes from pageable memory."""
    h2d, d2h = m.value_of(Step.MEMCPY_H2D_SHARE), m.value_of(Step.MEMCPY_D2H_SHARE)
    d2d = m.value_of(Step.MEMCPY_D2D_SHARE)
    if h2d is not None and d2h is not None:
        share: float | None = h2d + d2h
        pageable = m.value_of(Step.MEMCPY_H2D_PAGEABLE_SHARE) or 0.0
    else:  # a report before 0.2: copies of every direction together
        share = m.value_of(Step.MEMCPY_SHARE)
        pageable = m.value_of(Step.MEMCPY_PAGEABLE_SHARE) or 0.0
    if share is None or share <= MEMCPY:
        return None
    evidence = f"host <-> device copies take {share:.1%} of step time on the GPU"
    if h2d is not None and d2h is not None:
        evidence += f" (host to device {h2d:.1%}, device to host {d2h:.1%})"
    if pageable > 0:
        evidence += f"; {pageable:.1%} are host-to-device copies from pageable (unpinned) memory"
        fix = (
            "Pin the batches so copies run at full speed and asynchronously: "
            "`DataLoader(..., pin_memory=True)` and `batch.to(device, non_blocking=True)`. "
        )
    else:
        if h2d:
            evidence += "; every host-to-device copy is from pinned memory"
        fix = (
            "The copies come from pinned memory already: overlap them with compute by "
            "copying the next batch on a side CUDA stream (a prefetcher) with "
            "`non_blocking=True`. "
        )
    if d2d:
        evidence += (
            f"; device-to-device copies, {d2d:.1%} more, are counted apart (they stay on the GPU)"
        )
    # Not held back on a few steps: pageable copies are a setting seen, not a noisy time.
    return Finding(
        catalogue.PROFILE_MEMCPY,
        Severity.WARNING,
        f"Host <-> device copies take {share:.0%} of each step",
        evidence=evidence + ".",
        recommendation=fix
        + "Send less: uint8 images normalised on the GPU, int32 token ids; and look for "
        "device-to-host copies in the loop (`.item()`, `.cpu()`, `.numpy()`).",
        gain=Gain(
            GainKind.STEP_SHARE,
            round(share, 4),
            "copy time on the GPU timeline; at most, if every copy overlaps compute",
        ),
        stage="trace",
        fix={"pin_memory": True} if pageable > 0 else {},
    )


def _first_step(m: StepFigures) -> Finding | None:
    first, rest = m.value_of(Step.FIRST_STEP_MS), m.measured(Step.STEP_MS)
    if first is None or rest is None or not rest.median or first <= FIRST_STEP_STALL * rest.median:
        return None
    return Finding(
        catalogue.PROFILE_FIRST_STEP_STALL,
        Severity.INFO,
        f"The first step took {first / rest.median:.1f}x the others",
        evidence=f"first step {first:,.1f} ms; the other {rest.n}: median {rest.median:,.1f} ms. "
        "It is left out of every figure above.",
        recommendation="Once per run this is start-up (CUDA context, cuDNN autotuning, "
        "torch.compile, DataLoader workers starting). If it comes back every epoch, keep "
        "the workers alive between epochs: `DataLoader(..., persistent_workers=True)`.",
        stage="trace",
    )
