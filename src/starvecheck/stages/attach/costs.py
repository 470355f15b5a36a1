"""What attach's own sampling did and cost, as figures and caveats for the result; and
the marked scratch directory py-spy writes in (budget.py says why the rate may be lower
than asked, sampling.py how the py-spys are run)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from starvecheck.core.metric import Caveat
from starvecheck.core.schema.attachfigures import RankFigures, Sampler
from starvecheck.core.schema.figure import Figure
from starvecheck.core.status import UsageError
from starvecheck.stages.attach import budget
from starvecheck.stages.options import AttachOptions

if TYPE_CHECKING:
    from starvecheck.scratch.directory import Scratch
    from starvecheck.stages.attach.sampling import Cost, RankSampler, Sampling
    from starvecheck.stages.attach.target import Process

MAX_DURATION_S = AttachOptions.MAX_SECONDS  # --duration's ceiling
NO_SCRATCH = (
    "Python stacks not sampled: no scratch directory for py-spy's files could be made in "
    "the temporary directory (set TMPDIR to a writable directory); the figures below are "
    "/proc's alone"
)


@contextlib.contextmanager
def scratch(wanted: bool) -> Iterator[Scratch | None]:
    """A marked scratch directory in the temporary directory for py-spy's files (removed
    on every way out but SIGKILL, after which `starvecheck clean` proves it ours), where
    py-spy runs; None where it does not, or the directory cannot be made."""
    if not wanted:
        yield None
        return
    import tempfile

    from starvecheck.scratch.directory import Scratch

    try:
        made = Scratch(tempfile.gettempdir(), prefix="starvecheck-attach-")
        made.create()
    except (OSError, UsageError):
        yield None
        return
    try:
        yield made
    finally:
        made.cleanup()


def _figure(value: float | None) -> Figure | None:
    """A figure as attach writes it (rounded to 4 places); None where not read."""
    return None if value is None else Figure.single(round(float(value), 4))


def read(
    sampler: Sampling,
    seconds: float,
    effective_cpus: int,
    others_cpus: float | None,
    ranks: Sequence[Process],
    caveats: list[Caveat],
) -> tuple[Sampler, dict[int, RankFigures]]:
    """What attach's sampling took (py-spy's CPU, from the kernel's accounting), the rate
    it sampled at, and of each rank sampled what it dropped or did not take (its
    record's part of them, by PID); a caveat for each that bears on the answer."""
    cost = sampler.cost()
    restarted = cost.first_rate and cost.first_rate != cost.rate  # slower or faster
    out = Sampler(
        rate=_figure(cost.rate),
        rate_first=_figure(cost.first_rate) if restarted else None,
        cpus=_figure(cost.spy_cpus),
        cpu_seconds=_figure(cost.spy_cpu_s),
        budget_cpus=_figure(cost.budget_cpus),
        steady_cpus=_figure(cost.steady_cpus),
    )
    if cost.lowered and cost.sample_s >= seconds:  # else said by _samples
        caveats.append(
            Caveat(
                "attach.rate-lowered",
                f"stacks sampled at {cost.rate}/s, not {cost.requested}/s: {cost.lowered}",
            )
        )
    caveats += _samples(cost, seconds)
    busy = others_cpus is not None and others_cpus >= effective_cpus * 0.5
    if cost.spy_cpu_s > 0 and (cost.over_budget or busy):
        caveats.append(_cpu(cost))
    sampled = {
        r.pid: _rank(r, s, caveats) for r in ranks if (s := sampler.samplers.get(r.pid)) is not None
    }
    return out, sampled


def _samples(cost: Cost, seconds: float) -> list[Caveat]:
    """Where the window gives too few samples, or only some of its seconds were sampled
    (or none): say so, and the --duration that gives enough."""
    got = budget.samples_expected(cost.rate, cost.sample_s)
    if cost.sample_s < seconds:
        need = budget.duration_within_budget(cost.per_sample_cpu_s, cost.budget_cpus)
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
        how = "took" if cost.measured else "would take about"
        return [
            Caveat(
                "attach.few-samples" if cost.sample_s >= 1 else "attach.no-stacks",
                f"Python stacks {what}: with {cost.threads:,} threads py-spy {how} "
                f"{cost.per_sample_cpu_s:.3f} CPU seconds a sample, more than attach's "
                f"budget ({cost.budget_cpus:.2f} CPUs: {budget.BUDGET_SHARE:.0%} of the "
                f"machine's, or a quarter of the CPUs it left idle) allows at 1/s over "
                f"{seconds:g} s; {more}",
            )
        ]
    if got >= budget.MIN_SAMPLES:
        return []
    need = budget.duration_for(cost.rate)
    more = (
        f"`--duration {need}` gives {budget.MIN_SAMPLES}"
        if need <= MAX_DURATION_S
        else f"even `--duration {MAX_DURATION_S:.0f}` gives only "
        f"{budget.samples_expected(cost.rate, MAX_DURATION_S)}"
    )
    return [
        Caveat(
            "attach.few-samples",
            f"at {cost.rate}/s, {seconds:g} s gives about {got} samples of each thread, "
            f"fewer than the {budget.MIN_SAMPLES} a share needs; {more}",
        )
    ]


def _cpu(cost: Cost) -> Caveat:
    steady = f", {cost.steady_cpus:.3f} past its start-up" if cost.steady_cpus is not None else ""
    why = (
        f"more than its budget of {cost.budget_cpus:.2f} CPUs, even at {cost.rate}/s"
        if cost.over_budget
        else "the machine's CPUs were busy, so that CPU was taken from the job and others"
    )
    return Caveat(
        "attach.sampler-cpu",
        f"attach's sampling (py-spy) took {cost.spy_cpus:.3f} CPUs "
        f"({cost.spy_cpu_s:.2f} CPU seconds over {cost.seconds:g} s{steady}): {why}",
    )


def _rank(r: Process, s: RankSampler, caveats: list[Caveat]) -> RankFigures:
    """A rank's samples not taken, how far behind, workers not sampled; caveats where
    they bear on its shares."""
    missed = max(0, s.expected - s.taken)
    out = RankFigures(
        r.pid,
        r.rank,
        not_taken=_figure(missed),
        behind=_figure(s.progress.behind_s),
        workers_not_sampled=_figure(len(s.skipped)),
    )
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
                f"{r.describe()}: py-spy took {s.taken} of the {s.expected} samples its rate "
                f"should have given and dropped {dropped} (stacks caught mid-change)"
                f"{behind}; the shares are read from those it kept",
            )
        )
    if s.skipped:
        caveats.append(
            Caveat(
                "attach.workers-not-sampled",
                f"{len(s.skipped)} DataLoader worker(s) of {r.describe()} not sampled (at "
                f"most {budget.MAX_WORKERS} a rank, to bound attach's cost, or their stacks "
                "could not be read); their /proc figures are read all the same",
            )
        )
    return out
