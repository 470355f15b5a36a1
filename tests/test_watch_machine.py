"""watch reads the machine beside the loop (loop/cpu.MachineCpu): the other processes'
CPUs and the training process's own, about once a second, into its metrics; and the
worker advice it gives is bounded by them (advice/stepworkers.measured_advice into
advice/workers.py): no figure where the machine is too busy for the model to tell."""

from __future__ import annotations

import os
import time

import pytest

from starvecheck.advice.report import build_report
from starvecheck.core.context import Context
from starvecheck.core.model import GainKind
from starvecheck.loop.timer import Watch
from starvecheck.loop.times import LoopTimes
from tests.fixtures.golden_stages import cpu_bound_watch


def judged(others: list[float], load: float) -> dict:
    """The CPU-bound loop of tests/fixtures/golden_stages.py (24 ms of CPU a batch, a
    10 ms step), judged on 2 effective CPUs beside others' use."""
    stage = cpu_bound_watch(others, load)
    report = build_report("watch", None, [stage], Context())
    return {f.id: f for f in report.stages[0].findings}


def test_a_quiet_machine_gets_the_count_and_its_figure():
    f = judged([0.0, 0.02, 0.01, 0.0], load=0.5)["profile.data-bound"]
    assert f.fix == {"num_workers": 2} and f.gain.value is not None and f.gain.value > 1.05


def test_a_machine_loaded_past_twice_its_cpus_gets_no_figure_and_the_measured_path():
    # The watch runs: load average 6-8 on 2 CPUs, 4.33x predicted, 1.67x measured.
    f = judged([0.3, 0.35, 0.3], load=7.0)["profile.data-bound"]
    # No worker figure: the gain is the measured wait's share of the step, not a speed-up.
    assert not f.fix and f.gain.kind is GainKind.STEP_SHARE and f.gain.value
    assert f.gain.basis.startswith("no figure: ") and "data wait inside the steps" in f.gain.basis
    assert "too busy for a model to tell" in f.recommendation
    assert "`starvecheck loader --factory FILE.py:FUNC`" in f.recommendation


def test_others_taking_the_cpus_give_no_figure():
    f = judged([1.7, 1.8, 1.9, 1.8], load=1.5)["profile.data-bound"]
    assert not f.fix and "too busy" in f.recommendation and "left for workers" in f.recommendation


def test_a_watched_loop_carries_the_others_cpus_and_its_own():
    """A real loop of about 2.5 s (not timed: the readings' presence and sanity)."""
    w = Watch(list(range(50)), show=False)
    t0 = time.perf_counter()
    for _ in w:
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    m = {x.labels.get("quantity"): x for x in w.measured().metrics}
    cpus = os.cpu_count() or 1
    others, own = m["others_cpus_each_s"], m["process_cpus_each_s"]
    assert 1 <= len(others.values) <= seconds and len(own.values) == len(others.values)
    assert all(0.0 <= x <= cpus + 0.5 for x in others.values)
    assert all(0.0 <= x <= cpus + 0.5 for x in own.values)
    params = w.measured().parameters
    assert params["machine_cpus"] == cpus
    assert params["load_average"] is None or params["load_average"] >= 0


@pytest.mark.slow
def test_a_trainers_hooks_read_the_machine_too_where_it_loads_itself():
    from starvecheck.loop.cpu import MACHINE_EACH_S

    w = Watch((), show=False)
    w.times.num_workers = 0
    t0 = time.perf_counter()
    w.begin_pass()
    end = time.perf_counter() + 2.3
    while time.perf_counter() < end:
        w.begin_step()
        time.sleep(0.05)
        w.end_step()
    seconds = time.perf_counter() - t0
    # Readings come at least MACHINE_EACH_S apart: at most one a second of the time the
    # loop took (not a fixed 3: on a loaded machine the last step may end late).
    assert 1 <= len(w.times.others_cpus) <= seconds / MACHINE_EACH_S
    # With workers whose pids the hooks cannot see: not read (their CPU is not others').
    v = Watch((), show=False)
    v.times.num_workers = 2
    v.begin_pass()
    end = time.perf_counter() + 1.2
    while time.perf_counter() < end:
        v.begin_step()
        time.sleep(0.05)
        v.end_step()
    assert v.times.others_cpus == []


def test_a_ranks_machine_readings_travel_with_its_figures():
    from starvecheck.loop.times import RankTimes

    t = LoopTimes(waits=[0.05, 0.001], computes=[0.01, 0.01], passes=1)
    t.others_cpus, t.process_cpus = [0.5, 0.75], [1.0, 1.25]
    got = RankTimes.decode(t.encode(rank=1, final=True, window=64)).times
    assert got.others_cpus == [0.5, 0.75] and got.process_cpus == [1.0, 1.25]
    old = t.encode(rank=1, final=True, window=64).replace(b'"machine"', b'"unknown"')
    assert RankTimes.decode(old).times.others_cpus == []  # a rank of an older version


def test_a_stalled_reading_never_says_more_cpus_than_there_are(monkeypatch):
    """A stall between the clock and the readings (a loaded machine) makes the CPU time
    they count span more than the second timed: each figure stays at most the CPUs."""
    from starvecheck.loop import cpu
    from starvecheck.probe import load

    m = cpu.MachineCpu()
    assert m.last is not None, "no /proc/stat here"
    n = len(m.cpus) if m.cpus else (os.cpu_count() or 1)
    stretched = load.Load(1.0, 10.0 * n, None, None, None)
    monkeypatch.setattr(load, "between", lambda a, b, seconds: stretched)
    at, s, mine0 = m.last
    m.last = (at - 1.0, s, mine0 - 10.0 * n)  # 10 x the CPUs' seconds in one second
    others, process = [], []
    m.read(others, process)
    assert others == [n] and process == [n]
