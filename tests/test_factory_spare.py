"""--quick reads the full sweep's next count where its first round says the workers
wait and still gain (spare.py), and counts the first round read far below the best are
read no more (criteria.far_below, rounds.read_rounds): --quick names the count the
full run names, in its 30 s."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from starvecheck.core.criteria import far_below, knee_settled
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.rounds import read_rounds
from starvecheck.stages.loader.factory.run import Run
from starvecheck.stages.loader.factory.spare import spare_count, wanted
from starvecheck.stages.loader.factory.stage import default_workers
from tests.conftest import run as run_cli
from tests.test_factory_slow import SLEEPY  # 50 ms a sample, 8 a batch


def _run(workers: int, rate: float, cpu_s: float | None = 0.1, alive_s: float = 10.0) -> Run:
    r = Run(Config(workers, 2 if workers else None), samples_per_s=[rate])
    if workers:
        r.worker_cpu_s, r.worker_runq_s, r.worker_alive_s = cpu_s, 0.0, alive_s
    return r


def test_the_spare_is_the_full_sweeps_next_count_past_the_quick_top():
    assert spare_count(2, (0, 1, 2)) == 4
    assert spare_count(4, (0, 1, 2, 4)) == 8
    assert spare_count(2, (0, 1, 2, 4)) is None  # the full sweep's top already read


def test_a_spare_only_for_waiting_workers_still_gaining_at_the_top():
    waiting = [_run(0, 10), _run(1, 10), _run(2, 20)]
    assert wanted(waiting, 4) == Config(4, 2)
    # computing workers: past the CPUs they take the training process's CPU
    computing = [_run(0, 10), _run(1, 10, cpu_s=9.0), _run(2, 20, cpu_s=9.5)]
    assert wanted(computing, 4) is None
    missing = [_run(0, 10), _run(1, 10, cpu_s=None), _run(2, 20, cpu_s=None)]
    assert wanted(missing, 4) is None  # not measured: taken as computing
    flat = [_run(0, 10), _run(1, 10), _run(2, 12)]  # 1.2x for twice the workers
    assert wanted(flat, 4) is None
    assert wanted([_run(0, 10), _run(1, 30), _run(2, 20)], 4) is None  # top not the best
    assert wanted([_run(0, 10), _run(2, 20)], 4) is None  # one count with workers


def test_counts_read_once_far_below_are_settled_only_beside_a_best_read_again():
    assert far_below({0: [10, 10], 1: [10], 2: [20], 4: [40, 41]}, keep=0) == {1, 2}
    assert far_below({0: [10], 2: [18]}, keep=None) == {0}
    assert far_below({0: [10], 2: [16]}) == set()  # 0.625x: not far below
    assert knee_settled({0: [10, 10], 1: [10], 2: [20], 4: [40, 41]})
    assert not knee_settled({0: [10], 4: [40]})  # the best read once: no interval
    assert not knee_settled({0: [10, 10], 2: [36], 4: [40, 41]})  # 0.9x once: not far below


def test_rounds_grow_after_the_first_and_leave_what_it_decided():
    read: list[int] = []

    def read_one(config: Config) -> Run:
        read.append(config.workers)
        rate = 10 * max(1, config.workers)
        return Run(config, samples_per_s=[rate], window_s=1.0, window_samples=rate)

    todo = [("workers", Config(0)), ("workers", Config(1)), ("workers", Config(2))]
    runs = read_rounds(
        todo, 3, read_one, lambda _: None,
        grow=lambda done: [("workers", Config(4))],
        decided=lambda done: {Config(1)},
    )  # fmt: skip
    assert read[:4] == [0, 1, 2, 4]  # the spare read at once, as the first round's last
    assert read.count(1) == 1 and read.count(0) == read.count(2) == read.count(4) == 3
    assert [r.config.workers for _, r in runs] == [0, 1, 2, 4]
    assert [len(r.samples_per_s) for _, r in runs] == [3, 1, 3, 3]


@pytest.mark.slow
def test_quick_names_the_count_past_the_cpus_that_a_waiting_read_gains(tmp_path: Path):
    # 50 ms a sample (a read: no CPU): workers past the CPUs keep gaining; --quick reads
    # the full sweep's next count too and names it, as the full run does.
    cpus = len(os.sched_getaffinity(0))
    spare = spare_count(cpus, default_workers(cpus, True))
    if spare is None or spare > 8:
        pytest.skip(f"{cpus} CPUs: the spare count is {spare}")
    (tmp_path / "slowread.py").write_text(textwrap.dedent(SLEEPY))
    r = run_cli(
        "loader", "--factory", f"{tmp_path / 'slowread.py'}:make", "--quick", "--json", "-"
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    stage = json.loads(r.stdout)["stages"][0]
    (f,) = [f for f in stage["findings"] if f["id"] == "loader.own-config"]
    if f["title"].startswith("This machine is too busy to tell"):
        assert "fix" not in f  # other work kept the CPUs busy: said so, no count claimed
        return
    assert f["fix"] == {"num_workers": spare}
    assert 0.8 * spare <= f["gain"]["value"] <= 1.2 * spare


def _noisy(gain: float, noise: list[float]):
    """read_one: 2 workers `gain` times the rate of 0 or 1, each reading of 2 moved by
    the next of `noise` (the machine), in turn."""
    read: list[int] = []

    def read_one(config: Config) -> Run:
        read.append(config.workers)
        rate = 100.0 if config.workers < 2 else 100.0 * gain * noise[len(read) % len(noise)]
        return Run(config, samples_per_s=[rate], window_s=1.0, window_samples=int(rate))

    return read, read_one


def test_an_undecided_gain_is_read_on_in_rounds_of_its_two_configurations_only():
    from starvecheck.stages.loader.factory.rounds import More
    from starvecheck.stages.loader.factory.settled import undecided_pair

    # 1.2x, moved 0.85x-1.3x by the machine in the planned rounds (the readings of 2
    # are the 3rd, 5th and 7th): three rounds cannot clear 1.05x; later ones are calm.
    noise = [1.0] * 3 + [0.85, 1.0, 1.3, 1.0, 0.95] + [1.0] * 12
    read, read_one = _noisy(1.2, noise)
    now = Config(0)
    todo = [("current", now), ("workers", Config(1)), ("workers", Config(2))]
    more = More(lambda runs: undecided_pair(runs, now, 2.0), 6, 60.0)
    runs = read_rounds(todo, 3, read_one, lambda _: None, more=more)
    counts = {r.config.workers: len(r.samples_per_s) for _, r in runs}
    assert counts[1] == 3  # not in question: the planned rounds only
    assert counts[0] == counts[2] > 3  # read on, round by round, as a pair
    assert read[9:11] in ([0, 2], [2, 0])  # the first round past the plan: the pair only


def test_reading_on_stops_once_decided_within_its_rounds_and_seconds():
    from starvecheck.stages.loader.factory.rounds import More
    from starvecheck.stages.loader.factory.settled import undecided_pair

    now = Config(0)
    todo = [("current", now), ("workers", Config(2))]
    # A clear 2x: decided in the planned rounds, nothing more read.
    read, read_one = _noisy(2.0, [1.0, 1.02, 0.98])
    more = More(lambda runs: undecided_pair(runs, now, 2.0), 6, 60.0)
    read_rounds(todo, 3, read_one, lambda _: None, more=more)
    assert len(read) == 6
    # Undecided, but no seconds to spend: nothing more either.
    read, read_one = _noisy(1.2, [1.0, 1.0, 0.85, 1.3, 1.0, 1.0, 0.95] + [1.0] * 12)
    read_rounds(todo, 3, read_one, lambda _: None, more=More(more.undecided, 6, 0.0))
    assert len(read) == 6
    # Undecided, with rounds to spare: at most `rounds` more of the pair (the readings
    # of 2 in the planned rounds are the 2nd, 3rd and 6th: 1.02x, 1.56x, 1.14x).
    read, read_one = _noisy(1.2, [1.0, 1.0, 0.85, 1.3, 1.0, 1.0, 0.95] + [1.0] * 12)
    read_rounds(todo, 3, read_one, lambda _: None, more=More(more.undecided, 2, 60.0))
    assert len(read) == 6 + 2 * 2


def test_rounds_past_the_least_stop_once_the_slices_spent_longer_starting_than_reading():
    # Workers that take seconds to start pay it every slice: a set whose slices spent
    # longer starting (their first batch) than reading (their windows) stops after
    # `least` rounds, settled or not; one that reads longer than it starts reads every
    # round planned.
    def slices_of(start_s: float) -> int:
        read: list[int] = []

        def read_one(config: Config) -> Run:
            read.append(config.workers)
            r = Run(config, samples_per_s=[100.0], window_s=2.0, window_samples=200)
            r.first_batch_s, r.seconds = start_s, 2.0
            return r

        todo = [("workers", Config(0)), ("workers", Config(2))]
        read_rounds(todo, 5, read_one, lambda _: None, settled=lambda _: False)
        return len(read)

    assert slices_of(6.5) == 2 * 2  # 4 workers unpickling 200 MB: stop at least
    assert slices_of(0.3) == 2 * 5  # a fork's start: every round read
