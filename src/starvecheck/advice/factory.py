"""Judging `loader --factory`: the user's own pipeline, measured in every configuration,
in interleaved rounds (each configuration read once a round, side by side).

- `loader.own-config`: the DataLoader line to use, against the user's current one, or
  no change and why. The worker count is the fewest whose samples/s, round by round,
  is within 5% of the best count's (core/criteria.paired_knee), at or below the
  effective CPUs unless the workers' measured time shows they are blocked (I/O, sleep)
  rather than on a CPU or waiting for one; then lowered to what fits in memory and
  /dev/shm (advice/costs.py). prefetch_factor or persistent_workers join it where they
  measured faster than that count itself, read beside it, by EXTRA_MARGIN. The gain is
  the measured ratio of the configuration recommended over the current one, round by
  round, with its interval (core/paired.py): the two read in the same rounds (a
  variant against the current configuration read again beside it, role `again`); a
  change is recommended only where that interval clears no-change by the margin, else
  the finding says no change, and why.
  The gain is loading throughput (samples a second the loader delivers), never a
  training speed-up: with --step-ms it is also given as steps a second, capped by the
  step (at num_workers=0 loading and the step take turns; with workers they overlap,
  and the slower of the two sets the pace).
  No count and no gain where the figures cannot be true (core/explained.py: a ratio
  past what the worker counts explain, still there after the stage read them again:
  `loader.disturbed`), or where the machine is too busy to tell (other processes kept
  BUSY_SHARE of the CPUs while workers doing CPU work ran: a quick and a full run
  would name different counts).
- `loader.own-demand`: with --step-ms, the recommended configuration against the
  samples/s the GPU consumes (at num_workers=0 the GPU waits for every batch).
- `loader.main-threads`: at num_workers=0 the pipeline's torch operations ran on
  several threads of the training process.
- copies on read, batches crossing processes: advice/costs.py.

`complete` judges once (the result's `judged`): each configuration's ratio to the
current one (`vs_current`, `_low`, `_high`), the capacity of the one recommended
(doctor's loader link), the choice, and a caveat where other work moved the figures.
Reads the stage's records (core/schema/factory.py) by attribute, never a label key.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from starvecheck.advice import samples
from starvecheck.advice.configurations import (
    Point,
    describe,
    fix_of,
    line,
    moved_caveat,
    points,
)
from starvecheck.advice.costs import (
    batch_transfer,
    copy_on_read,
    main_threads,
    memory_cap,
    shm_forecast,
)
from starvecheck.advice.factory_bounds import (
    demand,
    disturbed,
    disturbed_caveat,
    no_figure,
    no_training_gain,
    stepped_gain,
    too_busy,
    training_gain,
    with_step,
)
from starvecheck.advice.factory_extra import extra_setting
from starvecheck.advice.factory_unread import withheld
from starvecheck.advice.loadstages import configuration_said
from starvecheck.advice.workers import Cpus, Throughput, recommend_workers
from starvecheck.core import catalogue
from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import Finding, Gain, GainKind, Judged, Severity, StageResult
from starvecheck.core.paired import MARGIN, Comparison, chained, compare
from starvecheck.core.schema.factory import BESIDE, SWEPT, Role, VsCurrent
from starvecheck.core.schema.factory import Parameters as FactoryParameters
from starvecheck.core.schema.factory_choice import Choice
from starvecheck.core.stages import FACTORY

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

# The change is worth a warning from this gain on.
WARN_GAIN = 1.5


def _current(found: list[Point]) -> Point | None:
    """The user's configuration as the first set read it (not its readings beside the
    variants: `base`, `again`)."""
    return next((p for p in found if p.current and p.role not in BESIDE), None)


def _against_current(p: Point, current: Point, found: list[Point]) -> Comparison | None:
    """p over the current configuration, round by round: directly where they were read
    in the same rounds (the worker counts and the current one; a variant and the
    current configuration read again beside it, `again`), else, where the current one
    is the count itself, through the count p was read beside (`base`)."""
    if p is current:
        return Comparison(1.0, 1.0, 1.0, len(p.rates))
    if p.role in SWEPT:
        return compare(p.rates, current.rates)
    again = next((q for q in found if q.role == Role.AGAIN), None)
    if again is not None:
        return compare(p.rates, again.rates)
    base = next((q for q in found if q.role == Role.BASE and q.workers == p.workers), None)
    same = next((q for q in found if q.role == Role.WORKERS and q.workers == p.workers), None)
    if base is None or same is None:
        return None
    first, then = compare(p.rates, base.rates), compare(same.rates, current.rates)
    return chained(first, then) if first is not None and then is not None else None


def choose(loader: StageResult) -> Choice | None:
    """The configuration to recommend (see the module docstring); None where the sweep
    measured nothing to choose from."""
    found = points(loader)
    params = loader.parameters.read(FactoryParameters)
    effective = float(params.cpus)
    sweep = {p.workers: p for p in found if p.role == Role.WORKERS}
    current = _current(found)
    if not sweep or current is None:
        return None
    best_count = max(sweep.values(), key=lambda p: p.rate)
    worked = best_count.cpu_work() if best_count.workers else True
    curve = {w: p.rate for w, p in sweep.items()}
    rounds = {w: p.rates for w, p in sweep.items()}
    advice = recommend_workers(Throughput(curve, worked, rounds), Cpus(effective))
    if advice is None:
        return None
    unexplained = tuple(disturbed(found, effective))
    busy = too_busy(found, effective, worked)
    if unexplained or busy is not None:
        return Choice(current, current, current, None, sweep, (), unexplained, busy)
    k = advice.workers
    notes = [advice.why]
    if any(p.unique for p in found):
        notes.append(
            "every samples/s counts unique samples only: with workers the pipeline "
            "delivers the same samples again (loader.repeats)"
        )
    cap, cap_why = memory_cap(sweep[k], params)
    if cap is not None and k > cap:
        fitting = [w for w in sweep if w <= cap]
        k = max(fitting, key=lambda w: sweep[w].rate) if fitting else 0
        notes.append(f"lowered to {k}: {cap_why}")
    best = sweep[k]
    extra = extra_setting(found, best, params.samples_in_dataset, params.start_method)
    if extra is not None:
        best, note = extra
        notes.append(note)
    against = _against_current(best, current, found)
    chosen = best if against is not None and best is not current and against.clears() else current
    return Choice(current, chosen, best, against, sweep, tuple(notes))


def complete(loader: StageResult) -> StageResult:
    """The result as the report carries it: every configuration's ratio to the current
    one with its interval, the capacity (the samples/s measured at the configuration
    recommended), and a caveat where other work moved the figures."""
    found = points(loader)
    current = _current(found)
    metrics: list[Metric] = []
    unexplained = disturbed(found, float(loader.parameters.cpus))
    suspect = {w for u in unexplained for w in (u.workers, u.against)}
    for p in found:
        c = _against_current(p, current, found) if current is not None else None
        if c is None or p.role in BESIDE or (p is not current and p.workers in suspect):
            continue  # a ratio its counts cannot explain is never shown as a gain
        metrics += p.figures.ratio_metrics(VsCurrent(c.ratio, c.low, c.high))
    caveats: list[Caveat] = []
    said = disturbed_caveat(unexplained)
    if said is not None:
        caveats.append(said)
    moved = moved_caveat(found, loader)
    if moved is not None and moved not in caveats:
        caveats.append(moved)
    choice = choose(loader)
    capacity = None
    if choice is not None:
        at = choice.chosen.figures.rate_metric()
        capacity = replace(at, name=f"capacity ({at.name})") if at is not None else None
    # chosen once per report (choice_of reads it)
    judged = Judged(tuple(metrics), capacity, tuple(caveats), choice=choice)
    return replace(loader, judged=judged)


def choice_of(loader: StageResult) -> Choice | None:
    """The configuration recommended, as `complete` chose it (once per report); chosen
    here for a result that was not completed."""
    made = loader.judged.choice
    return made if made is not None else choose(loader)


def chosen_of(choice: Choice | None) -> Point | None:
    return choice.chosen if choice is not None else None


def basis(loader: StageResult) -> str:
    """What doctor's loader link rests on, in words."""
    choice = choice_of(loader)
    where = loader.parameters.read(FactoryParameters).factory
    said = describe(choice.chosen) if choice is not None else "no configuration"
    return f"your pipeline {where}, {said}, measured (its decode and collate included)"


def rules(results: Results) -> list[Finding]:
    loader = results.get(FACTORY)
    if loader is None:
        return []
    found = points(loader)
    if not found:
        return []
    choice = choice_of(loader)
    now = choice.current if choice is not None else None
    swept = len(choice.sweep) if choice is not None else 0
    out = [_config(loader), demand(loader, chosen_of(choice), now, swept)]
    out.append(main_threads(loader, found))
    chosen = choice.chosen if choice is not None else None
    out += samples.rules(loader, found)
    out += copy_on_read(loader, found, chosen)
    out += shm_forecast(loader, found, chosen)
    out += batch_transfer(loader, found)
    return [f for f in out if f is not None]


def _evidence(choice: Choice, effective: float) -> str:
    rates = "; ".join(f"num_workers={w}: {p.rate:,.0f}" for w, p in sorted(choice.sweep.items()))
    text = f"current ({describe(choice.current)}): {choice.current.rate:,.0f} samples/s; {rates}"
    if choice.best is not choice.current and choice.best.role != Role.WORKERS:
        text += f"; {describe(choice.best)}: {choice.best.rate:,.0f}"
    if choice.against is not None and choice.best is not choice.current:
        text += (
            f"; {describe(choice.best)} over current, round by round: {choice.against.describe()}"
        )
    text += f" (medians over the rounds, this machine, {effective:g} effective CPUs)"
    return text + configuration_said(choice.current.figures.share, "with your settings")


def _undecided(best: Point, against: Comparison, evidence: str) -> Finding:
    """The best change's interval holds both no gain and one worth making: not a pass
    (principle 11), and not a change either; more rounds decide it."""
    return Finding(
        catalogue.LOADER_OWN_CONFIG,
        Severity.INFO,
        f"Could not tell whether {describe(best)} helps: {against.describe()} your "
        "settings, an interval from no gain to one worth making",
        evidence=evidence,
        recommendation=(
            f"Read it again without --quick, or with a larger --budget: a change is "
            f"recommended where its interval is above {1 + MARGIN:.2f}x, settings kept where "
            f"it is below {1 + 2 * MARGIN:.2f}x, and more rounds narrow it."
        ),
        stage="loader",
    )


def _config(loader: StageResult) -> Finding | None:
    if loader.parameters.read(FactoryParameters).read_as_is:
        return _as_is(loader)
    choice = choice_of(loader)
    if choice is None:
        return None
    if choice.disturbed or choice.busy is not None:
        return no_figure(
            loader, choice.disturbed, choice.busy, _evidence(choice, float(loader.parameters.cpus))
        )
    params = loader.parameters.read(FactoryParameters)
    effective = float(params.cpus)
    current, chosen, against = choice.current, choice.chosen, choice.against
    evidence = _evidence(choice, effective)
    if (cut := withheld(loader, choice.changes, (current.workers, chosen.workers))) is not None:
        return cut  # never a pass, nor a change, on figures not steady state
    if not choice.changes:
        if choice.best is current or against is None:
            title = (
                "Your DataLoader settings load as fast as any measured "
                f"({current.rate:,.0f} samples/s)"
            )
            recommendation = "Keep them. Why: " + "; ".join(choice.notes) + "."
        elif against.undecided():
            return _undecided(choice.best, against, evidence)
        else:
            title = (
                "No change clears the noise: the best measured, "
                f"{describe(choice.best)}, is {against.describe()} your settings"
            )
            recommendation = (
                f"Keep your settings: a change is recommended only where its interval is above "
                f"{1 + MARGIN:.2f}x, and this one's is not. A longer run (without --quick, or "
                "a larger --budget) narrows the interval."
            )
        return Finding(
            catalogue.LOADER_OWN_CONFIG,
            Severity.OK,
            title,
            evidence=evidence,
            recommendation=recommendation,
            fix=fix_of(current),
        )
    assert against is not None
    gain = round(against.ratio, 2)
    basis = (
        f"measured loading throughput: its samples/s over your settings', round by round, "
        f"{against.describe()}"
    )
    title = (
        f"{describe(chosen)} loads {gain:.2f}x as many samples a second as your current settings"
    )
    # The training figure: read with the step where it was (stepped_gain), else modelled.
    stepped = stepped_gain(params, chosen) if params.step_ms else None
    step = (
        round(stepped.ratio, 2)
        if stepped is not None
        else training_gain(current, chosen, params.step_ms, params.batch_size)
    )
    # Loads faster, trains no faster (a step gain is only had with the step given).
    if step is not None and params.step_ms is not None and step < 1 + MARGIN:
        return no_training_gain(title, step, float(params.step_ms), evidence, fix_of(current))
    title, basis, gain = with_step(title, basis, gain, step, params.step_ms, stepped)
    # Severity by the interval's low end: a short run, less certain, warns no sooner.
    severity = Severity.WARNING if against.low >= WARN_GAIN and gain >= WARN_GAIN else Severity.INFO
    return Finding(
        catalogue.LOADER_OWN_CONFIG,
        severity,
        title,
        evidence=evidence,
        recommendation=f"Use {line(chosen, params.batch_size)} (the rest as you have "
        "it). Why: " + "; ".join(choice.notes) + ".",
        gain=Gain(GainKind.THROUGHPUT, gain, basis),
        fix=fix_of(chosen),
    )


def _as_is(loader: StageResult) -> Finding | None:
    """FUNC returned an iterable that holds no DataLoader (a generator, a loader of the
    user's own): read as it is, and nothing of it swept."""
    found = points(loader)
    if not found:
        return None
    p = found[0]
    return Finding(
        catalogue.LOADER_OWN_CONFIG,
        Severity.INFO,
        f"Your loader was read as it is: {p.rate:,.0f} samples/s; nothing of it could be swept",
        evidence=(
            f"{loader.parameters.read(FactoryParameters).dataset}: not a torch DataLoader, "
            "Dataset or IterableDataset, and no DataLoader inside it"
        ),
        recommendation=(
            "To have num_workers, prefetch_factor and persistent_workers measured, return "
            "the Dataset (or the DataLoader) your loader reads from."
        ),
    )
