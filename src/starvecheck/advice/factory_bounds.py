"""What `loader --factory`'s figures may be made to say (advice/factory.py judges them):

- ratios between worker counts that the counts can explain (core/explained.py); one
  past that bound is a disturbed measurement, said in a caveat (`loader.disturbed`),
  and no count or gain is given from it;
- a machine too busy to tell: other processes kept BUSY_SHARE of the effective CPUs
  while workers doing CPU work were measured; no count, no gain, the load said;
- a loading gain in training terms, only where the step is known (--step-ms): steps a
  second, capped by the step that stays (`training_gain`), and `loader.own-demand`,
  the configuration recommended against the samples/s the GPU consumes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from starvecheck.advice.configurations import Point, describe, others_cpus
from starvecheck.core import catalogue
from starvecheck.core.explained import Cost, Unexplained, unexplained
from starvecheck.core.metric import Caveat, LabelValue
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult
from starvecheck.core.paired import Comparison, compare
from starvecheck.core.schema.factory import SWEPT
from starvecheck.core.schema.factory import Parameters as FactoryParameters
from starvecheck.core.schema.figure import value_of

# Too busy to tell: other processes kept this share of the effective CPUs busy (the
# median over the rounds) while workers doing CPU work were measured. Their figures then
# follow the other work, not the count: quick and full runs named 2 and 4 workers on a
# machine at load 6-8 on 2 CPUs.
BUSY_SHARE = 0.75

DISTURBED = (
    "A disturbed measurement: {}; no gain is given from these figures (batches counted "
    "that were made before their window, or a round the machine stalled)"
)


def _counts(found: list[Point]) -> dict[int, Point]:
    """The worker counts as the first set read them (the sweep and the current one)."""
    return {p.workers: p for p in found if p.role in SWEPT}


def disturbed(found: list[Point], cpus: float) -> list[Unexplained]:
    """The ratios between worker counts past what the counts explain."""
    counts = _counts(found)
    work = {w: p.cpu_work() for w, p in counts.items() if w}
    costs = {w: point_cost(p) for w, p in counts.items()}
    return unexplained({w: p.rates for w, p in counts.items()}, cpus, work, costs)


def point_cost(p: Point) -> Cost:
    """One sample's CPU and blocked time (core/explained.Cost), ms, from its figures: at
    num_workers=0 the main process's, its blocked time its wall time a sample less
    its CPU and run-queue time."""
    if not p.workers:
        cpu = value_of(p.figures.cpu_ms_main)
        runq = value_of(p.figures.runq_ms_main)
        if cpu is None or runq is None or p.rate <= 0:
            return Cost(cpu, None)
        return Cost(cpu, max(0.0, 1e3 / p.rate - cpu - runq))
    return Cost(
        value_of(p.figures.cpu_ms_workers),
        value_of(p.figures.blocked_ms_workers),
    )


def too_busy(found: list[Point], cpus: float, worked: bool | None) -> float | None:
    """Other processes' CPUs (the median over every round) where they kept BUSY_SHARE
    of the effective CPUs busy while workers doing CPU work were measured; None where
    the machine could tell (workers blocked in I/O or sleep need no CPU to wait)."""
    if worked is False or cpus <= 0:
        return None
    others = others_cpus(found)
    if not others:
        return None
    busy = statistics.median(others)
    return busy if busy >= BUSY_SHARE * cpus else None


def disturbed_caveat(found: Sequence[Unexplained]) -> Caveat | None:
    """The caveat naming every ratio past its bound, and the bound."""
    if not found:
        return None
    return Caveat("loader.disturbed", DISTURBED.format("; ".join(u.describe() for u in found)))


def training_gain(
    current: Point, chosen: Point, step_ms: object, batch_size: object
) -> float | None:
    """The steps a second `chosen` gives over `current` in a loop whose step (outside
    loading) takes `step_ms`: at num_workers=0 the process loads a batch, then runs its
    step (they add up); with workers they overlap, and the slower sets the pace, where
    the training process's own part of each batch (taking it from the workers: its CPU
    and its wait for a CPU the workers hold, as measured) comes before the step, on the
    step's path. None without a step or a batch size."""
    try:
        step_s = float(step_ms) / 1e3  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    batch = _batch(current, batch_size)
    if batch is None:
        return None
    if step_s <= 0 or batch <= 0 or current.rate <= 0 or chosen.rate <= 0:
        return None

    def per_step(p: Point) -> float:
        load = batch / p.rate
        return load + step_s if p.workers == 0 else max(load, step_s + batch * _main_s(p))

    return round(per_step(current) / per_step(chosen), 2)


def stepped_gain(params: FactoryParameters, chosen: Point) -> Comparison | None:
    """`chosen` over the current settings in a loop with the step (--step-ms) as a
    sleep after each batch, round by round, where that is the configuration read so
    (stages/loader/factory/stepped.py: the count called enough); else None."""
    if chosen.settings.start_method is not None:
        return None
    read = next((r for r in params.step_read if r.key == chosen.settings.key), None)
    return compare(read.changed, read.current) if read is not None else None


def with_step(
    title: str,
    basis: str,
    gain: float,
    step: float | None,
    step_ms: object,
    stepped: Comparison | None = None,
) -> tuple[str, str, float]:
    """The own-config finding's title, basis and gain with the training figure where
    the step is known (`stepped`: measured with it, else modelled); else said to be
    loading only."""
    if step is None:
        basis += (
            "; loading only, not a training speed-up: the step outside loading stays "
            "(--step-ms gives the training figure)"
        )
        return title, basis, gain
    ms = float(step_ms)  # type: ignore[arg-type]
    title += f"; with your {ms:g} ms step, {step:.2f}x the steps a second"
    if stepped is not None:
        basis += (
            f"; in training {step:.2f}x the steps a second, measured: the two read again "
            f"with your {ms:g} ms step (--step-ms) as a sleep after each batch, "
            f"{stepped.describe()}"
        )
    else:
        basis += (
            f"; in training {step:.2f}x the steps a second, the {ms:g} ms step (--step-ms) "
            "staying as it is"
        )
    return title, basis, step


def no_training_gain(
    loads: str, step: float, step_ms: float, evidence: str, keep: Mapping[str, LabelValue]
) -> Finding:
    """A configuration that loads faster and trains no faster with the step given: at
    num_workers=0 loading and the step add up, with workers they overlap."""
    return Finding(
        catalogue.LOADER_OWN_CONFIG,
        Severity.OK,
        f"{loads}, but with your {step_ms:g} ms step it trains at {step:.2f}x the steps a "
        "second: keep your settings",
        evidence=evidence,
        recommendation=(
            "Keep them. Why: with workers, loading overlaps the step (the slower of the two "
            "sets the pace); in the training process (num_workers=0) they add up, so the "
            "faster loading does not reach training. Measured with --step-ms as given."
        ),
        fix=keep,
    )


def _main_s(p: Point) -> float:
    """Seconds a sample of the training process's own time with workers: its CPU and
    its run-queue wait (0 where not measured)."""
    own = sum(
        x
        for f in (p.figures.cpu_ms_main, p.figures.runq_ms_main)
        if (x := value_of(f)) is not None and math.isfinite(x) and x > 0
    )
    return own / 1e3


def _batch(current: Point, batch_size: object) -> float | None:
    """A step's samples: the batch size, else (batch_size=None: each item a batch, or a
    batch_sampler) the samples a batch measured in the current configuration."""
    if isinstance(batch_size, int | float) and not isinstance(batch_size, bool):
        return float(batch_size) if batch_size > 0 else None
    samples = value_of(current.figures.samples_per_s)
    batches = value_of(current.figures.batches_per_s)
    return samples / batches if samples and batches else None


def no_figure(
    loader: StageResult,
    found: Sequence[Unexplained],
    busy: float | None,
    evidence: str,
) -> Finding:
    """No count and no gain: the figures cannot be true (a ratio past what the worker
    counts explain, still there once the stage read them again), or the machine was
    too busy to tell."""
    effective = float(loader.parameters.cpus)
    if found:
        what = "; ".join(u.describe() for u in found)
        return Finding(
            catalogue.LOADER_OWN_CONFIG,
            Severity.INFO,
            "No worker count can be recommended: the measured figures cannot be true",
            evidence=f"{what}; {evidence}",
            recommendation=(
                "Run it again on a quieter machine (without --quick, or with a larger "
                "--budget); a ratio its worker counts cannot explain is a disturbed "
                "measurement, never a gain."
            ),
        )
    return Finding(
        catalogue.LOADER_OWN_CONFIG,
        Severity.INFO,
        f"This machine is too busy to tell: other processes kept {busy or 0.0:.1f} of the "
        f"{effective:g} CPUs busy while the workers computed",
        evidence=evidence,
        recommendation=(
            "Measure again when the other work is done (or on a machine like the training "
            "one, idle): with the CPUs taken, the samples/s follow the other work, not the "
            "worker count, and runs name different counts."
        ),
    )


def demand(
    loader: StageResult, chosen: Point | None, now: Point | None, swept: int
) -> Finding | None:
    """With --step-ms: the configuration recommended (`chosen`; `now`: the current
    one; `swept`: how many worker counts were measured) against the samples/s the GPU
    consumes (batch size / step). At num_workers=0 the training process loads, then
    runs its step: the two take turns, and the GPU waits for every batch."""
    params = loader.parameters.read(FactoryParameters)
    step_ms, batch = params.step_ms, params.batch_size
    if not step_ms or not batch or chosen is None or now is None:
        return None
    wanted = float(batch) / (float(step_ms) / 1e3)
    evidence = (
        f"the GPU consumes {wanted:,.0f} samples/s ({batch} a batch every {step_ms:g} ms, "
        f"your figure); {describe(chosen)} delivers {chosen.rate:,.0f}"
        + ("" if chosen is now else f", your current settings {now.rate:,.0f}")
        + " (measured here)"
    )
    idle = _idle(chosen, wanted, float(step_ms), float(batch))
    if chosen.workers == 0:
        load_ms = float(batch) / chosen.rate * 1e3
        evidence += (
            f"; at num_workers=0 the training process loads each batch ({load_ms:,.1f} ms) and "
            f"then runs its step ({step_ms:g} ms): they take turns, so the GPU waits "
            f"{idle:.0%} of each step"
        )
    if idle < 0.05:
        said = "keeps" if chosen is now else "would keep"
        return Finding(
            catalogue.LOADER_OWN_DEMAND,
            Severity.OK if chosen is now else Severity.INFO,
            f"Your pipeline {said} up with the GPU ({chosen.rate / wanted:.1f}x its demand)",
            evidence=evidence,
        )
    title = (
        "At num_workers=0 the GPU waits for every batch: "
        if chosen.workers == 0
        else "No configuration measured keeps up with the GPU: "
    ) + f"it would wait {idle:.0%} of each step"
    recommendation = (
        "Load in worker processes (num_workers of 1 or more), so the next batch is made "
        "while the GPU runs the step: the sweep above measured what they deliver here."
        if chosen.workers == 0 and swept > 1
        else "More workers do not close this gap on this machine (the sweep above measured "
        "them). Do the per-sample work once, offline (decode and resize to the training "
        "resolution, pre-tokenize), move conversion and augmentation to the GPU, or give "
        "the job more CPUs."
    )
    return Finding(
        catalogue.LOADER_OWN_DEMAND,
        Severity.CRITICAL if idle > 0.2 else Severity.WARNING,
        title,
        evidence=evidence,
        recommendation=recommendation,
        gain=Gain(GainKind.STEP_SHARE, round(idle, 4), "the share of each step the GPU waits"),
    )


def _idle(p: Point, demand: float, step_ms: float, batch: float) -> float:
    """The share of each step the GPU waits with `p`: at num_workers=0, the whole load
    (serial); with workers, what delivery falls short of the demand."""
    if p.rate <= 0:
        return 1.0
    load_ms = batch / p.rate * 1e3
    if p.workers == 0:
        return load_ms / (load_ms + step_ms)
    return max(0.0, 1 - p.rate / demand)
