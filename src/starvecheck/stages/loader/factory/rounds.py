"""Configurations read in interleaved rounds (`loader --factory`): every configuration
read once a round, in an order that turns each round, so that two configurations
compared are read seconds apart, never minutes, and a machine whose other work comes
and goes slows both alike: their ratio, round by round, holds where their figures do
not (core/paired.py compares them so). A configuration's slices merge into one run
with one figure a round.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starvecheck.core import clocks
from starvecheck.stages.loader.factory.load import Pipeline
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.run import Budget, Run

ROUNDS = {False: 5, True: 3}  # full, quick

Measure = Callable[[Pipeline, Config, Budget, Any], Run]
Progress = Callable[[str, int, int], None]


def rotated(items: list[Any], by: int) -> list[Any]:
    """`items` turned by `by` places: round r starts at its r-th configuration."""
    if not items:
        return items
    k = by % len(items)
    return items[k:] + items[:k]


Settled = Callable[[list[tuple[str, Run]]], bool]
# What the first round asks to read beside the rest (--quick's next worker count).
Grow = Callable[[list[tuple[str, Run]]], list[tuple[str, Config]]]
# What the first round settled already: configurations read no more.
Decided = Callable[[list[tuple[str, Run]]], set[Config]]
# What the planned rounds left undecided: the configurations to read on (none: done).
Undecided = Callable[[list[tuple[str, Run]]], set[Config]]


@dataclass(frozen=True)
class More:
    """Rounds past the planned ones, of what `undecided` names only, while it names
    any: at most `rounds` of them, and none that the last readings of those
    configurations say would end past `seconds` spent on them."""

    undecided: Undecided
    rounds: int
    seconds: float


def read_rounds(
    todo: list[tuple[str, Config]],
    rounds: int,
    read_one: Callable[[Config], Run],
    progress: Callable[[str], None],
    settled: Settled | None = None,
    least: int = 2,
    grow: Grow | None = None,
    decided: Decided | None = None,
    given: dict[Config, Run] | None = None,
    more: More | None = None,
) -> list[tuple[str, Run]]:
    """(role, run) for each of `todo`, each read `rounds` times, in turn; fewer where,
    after `least` rounds or more, `settled` says the rounds so far decide what judging
    will make of them (more rounds could not change it: their intervals say so).
    `grow`, asked once the first round is read, may add configurations: each is read
    at once, as the first round's last, and in every round after. `decided`, asked
    then too, names configurations the first round settled: read no more (their one
    figure pairs with the others' first). `given`: configurations read already, as
    their first round's reading (read ahead of the round to decide what it reads).
    `more`: rounds past `rounds` of the configurations it finds undecided (More).
    Rounds past `least` also stop, settled or not, once the slices of the
    configurations still read have spent longer starting (each slice starts its
    workers: their first batch) than reading (their windows): a pipeline whose workers
    take seconds to start would spend most of its run starting them."""
    todo = list(todo)
    given = dict(given or {})
    slices: dict[Config, list[Run]] = {c: [] for _, c in todo}
    took: dict[Config, float] = {}
    done_with: set[Config] = set()

    def read(config: Config) -> None:
        began = clocks.perf_counter()
        slices[config].append(read_one(config))
        took[config] = clocks.perf_counter() - began

    for r in range(rounds):
        for _, config in rotated([t for t in todo if t[1] not in done_with], r):
            if r == 0 and config in given:
                slices[config].append(given.pop(config))
                continue
            progress(f"round {r + 1} of {rounds}: {config.describe()}")
            read(config)
        if grow is not None and r == 0:
            for role, config in grow([(role, merge(slices[c])) for role, c in todo]):
                if config in slices:
                    continue
                progress(f"round 1 of {rounds}: {config.describe()}")
                slices[config] = []
                read(config)
                todo.append((role, config))
        if decided is not None and r == 0:
            done_with = decided([(role, merge(slices[c])) for role, c in todo])
        done = [(role, merge(slices[c])) for role, c in todo] if settled else []
        if settled is not None and least <= r + 1 < rounds and settled(done):
            break
        reading = [slices[c] for _, c in todo if c not in done_with]
        if least <= r + 1 < rounds and _starting(reading):
            break
    if more is not None:
        _read_on(todo, slices, took, more, rounds, read, progress)
    return [(role, merge(slices[c])) for role, c in todo]


def _starting(reading: list[list[Run]]) -> bool:
    """The slices read have spent longer starting their workers than reading."""
    runs = [r for slices in reading for r in slices]
    return bool(runs) and sum(r.first_batch_s for r in runs) > sum(r.seconds for r in runs)


def _read_on(
    todo: list[tuple[str, Config]],
    slices: dict[Config, list[Run]],
    took: dict[Config, float],
    more: More,
    rounds: int,
    read: Callable[[Config], None],
    progress: Callable[[str], None],
) -> None:
    """More's rounds: the configurations it finds undecided, read in turn, a round at
    a time, while it finds any, within its rounds and seconds. Every one of them has
    as many figures as the others it is paired with (each read in each extra round)."""
    spent = 0.0
    for extra in range(more.rounds):
        focus = more.undecided([(role, merge(slices[c])) for role, c in todo])
        order = [c for _, c in todo if c in focus and slices[c]]
        if len(order) < 2 or len({len(slices[c]) for c in order}) > 1:
            return
        cost = sum(took.get(c, 0.0) for c in order)
        if spent + cost > more.seconds:
            return
        r = rounds + extra
        for config in rotated(order, r):
            progress(f"round {r + 1} (read on: the gain undecided): {config.describe()}")
            read(config)
            spent += took[config]


def merge(slices: list[Run]) -> Run:
    """One configuration read in several slices, one a round: `samples_per_s` and
    `batches_per_s` hold one figure per slice, in round order, so two configurations
    pair round by round; times and CPU add up; the first batch is the first slice's;
    memory is the longest slice's (each slice starts fresh workers)."""
    first = slices[0]
    out = Run(first.config, first_batch_s=first.first_batch_s, stopped="rounds")

    def total(name: str) -> float | None:
        values = [getattr(r, name) for r in slices]
        return None if any(v is None for v in values) else sum(values)

    for r in slices:
        if r.window_s > 0 and r.window_samples:
            out.samples_per_s.append(r.window_samples / r.window_s)
            out.batches_per_s.append(r.window_batches / r.window_s)
        out.window_s += r.window_s
        out.window_samples += r.window_samples
        out.window_batches += r.window_batches
        out.waits_ms += r.waits_ms
        out.batch_bytes += r.batch_bytes
        out.restarts_s += r.restarts_s
        out.copy_s += r.copy_s
        out.samples += r.samples
        out.batches += r.batches
        out.seconds += r.seconds
        out.epochs += r.epochs
        out.fingerprinted += r.fingerprinted
        out.repeats += r.repeats
        out.unreadable += r.unreadable
        out.digest_s += r.digest_s
        for why, n in r.digest_skipped.items():
            out.digest_skipped[why] = out.digest_skipped.get(why, 0) + n
        for worker, n in r.worker_batches.items():
            out.worker_batches[worker] = out.worker_batches.get(worker, 0) + n
    names = ("main_cpu_s", "worker_cpu_s", "main_runq_s", "worker_runq_s", "worker_alive_s")
    for name in (*names, "main_span_s"):
        setattr(out, name, total(name))
    others = [r.others_cpus for r in slices if r.others_cpus is not None]
    out.others_cpus = statistics.median(others) if others else None
    out.others_each = [r.others_cpus for r in slices]
    out.partial = any(r.partial for r in slices)
    splits = [r.split for r in slices if r.split is not None]
    out.split = splits[0] if splits else None
    for more in splits[1:]:
        out.split = out.split.merged(more)
    longest = max(slices, key=lambda r: r.samples)
    out.main_memory, out.worker_memory = longest.main_memory, longest.worker_memory
    restarts = out.restarts_s or [r.restart_s for r in slices if r.restart_s is not None]
    if not restarts and not first.config.persistent_workers:
        # No epoch ended inside a slice: without persistent workers every epoch starts
        # as each slice did, new workers and their first batch.
        restarts = [r.first_batch_s for r in slices if r.first_batch_s > 0]
    out.restart_s = statistics.median(restarts) if restarts else None
    return out
