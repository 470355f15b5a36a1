"""attach's worker advice bounded by the machine as measured (advice/attach.py into
advice/workers.py): results built by hand with the figures attach's JSON carries, the
issue's case among them, and the per-second readings of the other processes' CPUs
(stages/attach/readings.py) on this machine."""

from __future__ import annotations

import os
import time

import pytest

from starvecheck.advice.attach import rules
from starvecheck.advice.results import Results
from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.stages.attach.readings import Watch

PID = 4242


def _m(quantity: str, v: float, **labels: object) -> Metric:
    return Metric.single(f"attach.{quantity}", v, "x", {"quantity": quantity, **labels})


def result(others_each: list[float] | None, load: float = 1.0) -> StageResult:
    """The issue's loop as attach reads it: one CPU-bound worker, the main thread on a
    CPU through its 10 ms step (40% of its time) and waiting 60% for data."""
    lab = {"rank": None, "pid": PID}
    metrics = [
        _m("samples", 500, **lab),
        Metric.single(
            "attach.main_share", 0.6, "share", {"quantity": "main_share", "kind": "data", **lab}
        ),
        Metric.single(
            "attach.main_share", 0.4, "share", {"quantity": "main_share", "kind": "step", **lab}
        ),
        _m("workers_found", 1, **lab),
        _m("main_thread_cpus", 0.42, **lab),
        _m("main_cpus", 0.45, **lab),
        _m("workers_cpus", 0.45, **lab),
        _m("workers_runq_cpus", 0.35, **lab),
        _m("workers_blocked_share", 0.2, **lab),
        _m("machine_cpus", 2.0),
        _m("load_average", load),
    ]
    if others_each is not None:
        metrics.append(
            Metric.repeated(
                "attach.machine.others_cpus_each_s",
                others_each,
                "CPUs",
                {"quantity": "others_cpus_each_s"},
            )
        )
        metrics.append(_m("others_cpus", sorted(others_each)[len(others_each) // 2]))
    params = {
        "ranks": [{"pid": PID, "rank": None, "command": "python train.py", "workers": [7]}],
        "seconds": 10.0,
        "effective_cpus": 2.0,
    }
    return StageResult("attach", params, tuple(metrics))


def bound(r: StageResult):
    return next(f for f in rules(Results({"attach": r})) if f.id == "attach.loader-bound")


def test_the_issues_case_is_too_busy_for_a_figure_and_names_the_measured_path():
    # Another process using 1.2 of the 2 CPUs: the old model said num_workers=2, 3.11x.
    f = bound(result([1.1, 1.2, 1.3, 1.2, 1.25, 1.15, 1.2, 1.2]))
    assert not f.fix and f.gain is not None and f.gain.value is None
    assert "too busy for a model to tell" in f.recommendation
    assert "starvecheck loader --factory FILE.py:FUNC" in f.recommendation
    assert "DataLoader(..., num_workers=" not in f.recommendation


def test_a_loaded_machine_by_its_load_average_gives_no_figure():
    f = bound(result([0.3] * 8, load=7.0))
    assert not f.fix and "load average is 7.0 on 2 CPU(s)" in f.recommendation


def test_on_a_quiet_machine_the_count_stands_and_within_n_plus_k_over_n():
    f = bound(result([0.0, 0.01, 0.02, 0.0]))
    if f.fix:
        n = f.fix["num_workers"]
        assert f.gain is not None and 1.05 <= f.gain.value <= n / 1 + 1e-9
    assert "too busy" not in (f.recommendation or "")


def test_the_per_second_readings_of_the_others_are_there_and_sane():
    """Watch on this process for about two seconds: one reading of the other processes'
    CPUs a second or so, each between none and the machine's CPUs."""
    from starvecheck.stages.attach.readings import EACH_S

    t0 = time.perf_counter()
    w = Watch({os.getpid(): []}, None)
    end = time.perf_counter() + 2.1
    while time.perf_counter() < end:
        time.sleep(0.5)
        w.tick()
    out = w.finish()
    # Readings come at least EACH_S apart: at most one a second of the time the loop
    # took (not a fixed 3: on a loaded machine the last tick may come late).
    assert 1 <= len(w.others_each) <= (time.perf_counter() - t0) / EACH_S
    cpus = os.cpu_count() or 1
    assert all(0.0 <= x <= cpus + 0.5 for x in w.others_each)
    assert out["machine_cpus"] == cpus
    assert out["load_average"] is None or out["load_average"] >= 0


@pytest.mark.slow
def test_attachs_json_carries_the_others_cpus_each_second(tmp_path, monkeypatch):
    """End to end on a real loop (stacks refused, as without SYS_PTRACE, so that no
    py-spy runs): the JSON holds the other processes' CPUs each second, the machine's
    CPUs and load average, sane (not timed)."""
    import json
    import sys

    from typer.testing import CliRunner

    from starvecheck.cli.main import app
    from starvecheck.stages.attach import spy
    from tests.test_attach import LOOP, started, stop

    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(spy, "py_spy", lambda: str(fake))
    path = tmp_path / "state.json"
    p = started([sys.executable, str(LOOP), "data", str(path)], path)
    try:
        r = CliRunner().invoke(app, ["attach", str(p.pid), "--duration", "2", "--json", "-"])
    finally:
        stop(p)
    assert r.exit_code == 0, r.output
    stage = json.loads(r.stdout)["stages"][0]
    by = {m["labels"].get("quantity"): m for m in stage["metrics"]}
    each = by["others_cpus_each_s"]
    cpus = os.cpu_count() or 1
    assert each["values"] and all(0.0 <= x <= cpus + 0.5 for x in each["values"])
    assert by["machine_cpus"]["value"] == cpus and by["load_average"]["value"] >= 0


def test_a_stalled_machine_reading_never_says_more_cpus_than_there_are(monkeypatch):
    """A stall between attach's clock and /proc/stat (a loaded machine) makes the busy
    time span more than the second timed: the other processes' CPUs stay at most the
    CPUs, each second and over the whole window."""
    import dataclasses

    from starvecheck.stages.attach import readings

    w = Watch({os.getpid(): []}, None)
    assert w.machine0 is not None and w._mark.busy is not None, "no /proc/stat here"
    n = len(w.cpus) if w.cpus else (os.cpu_count() or 1)
    busy = w._mark.busy + 10.0 * n  # 10 x the CPUs' seconds in about one second
    monkeypatch.setattr(readings, "_machine", lambda cpus: busy)
    w._mark = dataclasses.replace(w._mark, at=w._mark.at - 1.0)
    w.tick()
    assert w.others_each == [n]
    assert w.finish()["others_cpus"] == n
