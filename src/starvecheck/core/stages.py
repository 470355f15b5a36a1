"""The one stage table: every stage's modules, the name its results report under, and
where doctor and the judge place it.

A stage's name keys this table and nothing else. The CLI's commands, the registry
that finds a stage's measuring module (stages/registry.py), the judge's rules and
completions and its authority tiers (advice/judge.py), the tables each stage's metrics
are shown in (render/sections.py), the name the JSON gives a result (core/model.py)
and doctor's stages and their order (stages/doctor/measure.py) all read it. Modules
are named as strings and imported on first use, so `starvecheck env` and `--help`
never load what `loader` or `pcie` need, and core stays below every other layer.

Adding a stage: write its own files (stages/, advice/, render/, cli/), then add one
row below; nothing else names it (tests/test_stage_table.py shows it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

_PACKAGE = "starvecheck"
FACTORY = "factory"  # `loader --factory`'s entry: its results are looked up by it


@dataclass(frozen=True)
class StageEntry:
    """One stage: its modules (dotted paths under the package) and its places."""

    name: str
    # Modules are dotted names under the package (`module` gives the full one).
    # stages/: the module that exposes STAGE (None: judged only, as watch and doctor are).
    measure: str | None = None
    # advice/: the modules whose `rules(results)` judge it, in the order they are asked.
    judge: tuple[str, ...] = ()
    # advice/: the module whose `complete(result)` adds the judgement the report carries
    # beside the figures (recommended num_workers, capacity, overlap verdicts).
    complete: str | None = None
    # render/: the modules whose `sections(stage, metrics)` show its metrics, in order.
    render: tuple[str, ...] = ()
    # The name the JSON and the screen give its results and findings (schema 1's).
    reported_as: str | None = None
    # Whose setting wins where two findings recommend different values: the lower tier
    # measured it more directly (advice/judge.reconcile).
    authority: int = 5
    # Its place in doctor's run (plans first, cheap ones that can refuse bad input
    # first); None: doctor does not run it. The table's order is the chain's order.
    doctor_runs: int | None = None
    # cli/: the module that registers its command (None: it has none of its own).
    command: str | None = None
    # The chain's link its findings are about (advice/chain.py); None: no link's.
    link: str | None = None
    # The machine facts its command's report shows, by row label (render/facts.py), and
    # the unknown facts worth listing, by key prefix; None: every one.
    facts: tuple[str, ...] | None = None
    unknown_facts: tuple[str, ...] | None = None
    # Where its command writes test data: how to measure without writing instead (only
    # options the command has), appended to the error that refuses the directory.
    without_writing: str = ""

    @property
    def shown_as(self) -> str:
        return self.reported_as or self.name


def module(name: str) -> str:
    """A module of the table, by its full dotted name."""
    return f"{_PACKAGE}.{name}"


def load(name: str) -> ModuleType:
    """A module the table names (`advice.io`), imported on first use."""
    return importlib.import_module(module(name))


# In the chain's order, from the machine to the GPU step, then the loops and the jobs.
TABLE: tuple[StageEntry, ...] = (
    StageEntry("env", "stages.env", ("advice.env",), authority=3, command="cli.env"),
    StageEntry(
        "io",
        "stages.io",
        ("advice.io",),
        render=("render.throughput",),
        authority=2,
        doctor_runs=2,
        command="cli.io",
        link="storage",
        facts=("CPU", "Memory", "Container", "Storage"),
        unknown_facts=("cpu.", "memory.", "storage."),
        without_writing="; to read your own files without writing use --existing",
    ),
    StageEntry(
        "loader",
        "stages.loader.stage",
        ("advice.loader",),
        "advice.loader",
        ("render.loader",),
        authority=1,
        doctor_runs=3,
        command="cli.loader",
        link="loader",
        # DataLoader workers hand batches over through /dev/shm.
        facts=("CPU", "Memory", "/dev/shm", "Container", "Storage"),
        unknown_facts=("cpu.", "memory.", "shm.", "storage."),
        without_writing="; to read your own files without writing use --existing",
    ),
    # `loader --factory`: the user's own pipeline.
    StageEntry(
        FACTORY,
        "stages.loader.factory.stage",
        ("advice.factory", "advice.startmethod"),
        "advice.factory",
        ("render.factory",),
        reported_as="loader",
        authority=1,
        link="loader",
    ),
    StageEntry(
        "starve",
        "stages.starve.stage",
        ("advice.starve",),
        "advice.starve",
        authority=1,
        doctor_runs=1,
        command="cli.starve",
        link="loader",
    ),
    StageEntry(
        "pad",
        "stages.pad.stage",
        ("advice.pad",),
        render=("render.pad",),
        authority=4,
        doctor_runs=0,
        command="cli.pad",
        # Padding is a property of the data and the batching, not of this machine.
        facts=(),
        unknown_facts=(),
    ),
    StageEntry(
        "profile",
        "stages.profile.stage",
        ("advice.profile",),
        render=("render.profile",),
        authority=0,
        command="cli.profile",
        without_writing="; to read your own run's traces without writing use --trace",
    ),
    StageEntry(
        "pcie",
        "stages.pcie.stage",
        ("advice.pcie",),
        "advice.pcie",
        ("render.pcie",),
        doctor_runs=4,
        command="cli.pcie",
        link="pcie",
    ),
    StageEntry(
        "doctor",
        authority=4,
        command="cli.doctor",
        without_writing="; to measure without writing skip io and loader: --skip io,loader",
    ),
    # `profile --trace`: traces another run left.
    StageEntry(
        "trace",
        "stages.trace.stage",
        ("advice.trace",),
        "advice.trace",
        ("render.trace",),
        reported_as="profile",
        authority=0,
    ),
    # A user's own loop, timed by starvecheck.watch.
    StageEntry(
        "watch",
        judge=("advice.trace", "advice.loopdata"),
        render=("render.trace", "render.loadstages"),
        authority=0,
    ),
    # A running job, read without touching it.
    StageEntry(
        "attach",
        "stages.attach.stage",
        ("advice.attach",),
        render=("render.attach",),
        command="cli.attach",
    ),
)
# Commands that are not a stage's own, in `starvecheck --help`'s order after them.
OTHER_COMMANDS = ("cli.clean",)
# Every stage's tables are tried first, then this one: a sweep of figures by num_workers
# (labels `quantity` and `workers` alone) from whichever stage made it.
RENDER_LAST = ("render.sweep",)


def entry(name: str) -> StageEntry:
    """The stage's row; a name not in the table has no modules and reports as itself."""
    return next((e for e in TABLE if e.name == name), None) or StageEntry(name)


def reported_as() -> dict[str, str]:
    """{stage: the name its results report under}, where that is another's."""
    return {e.name: e.reported_as for e in TABLE if e.reported_as}


def doctor_run_order() -> tuple[str, ...]:
    """The stages doctor runs, in the order it makes their plans and measures."""
    runs = [e for e in TABLE if e.doctor_runs is not None]
    return tuple(e.name for e in sorted(runs, key=lambda e: e.doctor_runs or 0))


def doctor_chain() -> tuple[str, ...]:
    """The stages doctor runs, in the chain's order (as --only and --skip name them)."""
    return tuple(e.name for e in TABLE if e.doctor_runs is not None)


def commands() -> tuple[str, ...]:
    """The CLI modules that register a command (for `load`), in `starvecheck --help`'s
    order."""
    return (*(e.command for e in TABLE if e.command), *OTHER_COMMANDS)
