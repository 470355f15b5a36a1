"""`profile --trace` against traces made to hurt: what a trace claims (world size,
ranks, timestamps) bounded, the analysis linear in events however its steps overlap,
a folder of too many files and a run that takes too long each one line; and the
remedies profile and doctor suggest are options they have."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.stages import trace
from starvecheck.stages.trace.intervals import clip, length, overlap, union
from tests.conftest import PEAK, one_line, run

# The module, not the function of that name the package exports.
trace_load = importlib.import_module("starvecheck.stages.trace.load")

STEP = "ProfilerStep#{}"
FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _x(name: str, ts: float, dur: float, cat: str = "user_annotation", pid: int = 0) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": 0}


def _traced(path, events, **info) -> str:
    doc = {"traceEvents": events}
    if info:
        doc["distributedInfo"] = info
    path.write_text(json.dumps(doc))
    return str(path)


def _small(tmp_path, name: str = "t.json", **info) -> str:
    events = [_x(STEP.format(i), i * 100, 100) for i in range(4)]
    events += [_x(FETCH, i * 100, 30) for i in range(4)]
    return _traced(tmp_path / name, events, **info)


# -- what a trace claims ----------------------------------------------------------


def test_a_forged_world_size_of_a_billion_is_one_line_in_bounded_memory(tmp_path):
    """A 1 KB trace claiming 10^9 ranks once built a list of every missing rank: 1.5
    GiB and an OOM kill. Refused now, in a fresh process, fast and small."""
    path = _small(tmp_path, rank=0, world_size=10**9)
    argv = [sys.executable, "-m", "starvecheck", "profile", "--trace", path]
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, timeout=120
    )
    elapsed = time.monotonic() - started
    *lines, peak = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "world_size 1000000000 is past 1,048,576 ranks" in lines[0]
    assert int(peak) < 300 * 1024, f"peak {int(peak) // 1024} MiB"
    assert elapsed < 30


def test_a_world_size_at_the_bound_lists_the_missing_ranks_as_spans(tmp_path):
    path = _small(tmp_path, rank=3, world_size=trace_load.MAX_WORLD_SIZE)
    r = run("profile", "--trace", path, "--json", "-")
    assert r.exit_code in (0, 1), r.stderr
    (stage,) = json.loads(r.stdout)["stages"]
    (missing,) = [c for c in stage["caveats"] if "have no trace here" in c]
    assert "1048575 of the job's 1048576 ranks have no trace here (rank(s) 0-2, 4-1048575)" in (
        missing
    )


def test_a_forged_rank_is_one_line(tmp_path):
    path = _small(tmp_path, rank=2**62, world_size=4)
    assert "distributedInfo.rank 461168601842... (19 digits) is past" in one_line(
        run("profile", "--trace", path)
    )


@pytest.mark.parametrize(
    ("ts", "dur"),
    [
        (2**63 - 1000, 50),  # near 2^63: a double rounds it by 2 ms
        (9.2e18, 50.0),
        (1e300, 1.0),
        (0, 1e300),
        (-(2**60), 10),
        (2**53, 1),
    ],
)
def test_times_no_clock_holds_exactly_are_refused(tmp_path, ts, dur):
    """Near 2^63 us a double rounds by milliseconds: a step's figures turned into
    nonsense (a warning became CRITICAL). 1e300 was read as a time."""
    events = [_x(STEP.format(i), i * 100, 100) for i in range(4)] + [_x(FETCH, ts, dur)]
    path = _traced(tmp_path / "t.json", events)
    assert "is past 2^53 us (285 years) from the clock's zero" in one_line(
        run("profile", "--trace", path)
    )


def test_times_inside_the_clock_are_read_exactly(tmp_path):
    """Up to 2^53 us every integer time is exact: a step there waits exactly 30 us of
    100, as one at zero does."""
    base = 2**53 - 10_000
    events = [_x(STEP.format(i), base + i * 100, 100) for i in range(4)]
    events += [_x(FETCH, base + i * 100 + 7, 30) for i in range(4)]
    a = trace.analyze(events)
    assert [s.data_wait for s in a.steps] == [30.0] * 4
    assert [s.dur for s in a.steps] == [100.0] * 4


def test_a_clock_base_past_the_range_is_refused(tmp_path):
    path = tmp_path / "t.json"
    events = [_x(STEP.format(i), i * 100, 100) for i in range(4)]
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1e300}))
    assert "baseTimeNanoseconds 1e+300 is past 2^53 us" in one_line(
        run("profile", "--trace", str(path))
    )


# -- linear, however the steps overlap ---------------------------------------------


def _steps_trace(n: int, overlapping: bool) -> list[dict]:
    """n profiler steps, a fetch and a kernel in each; overlapping: every step spans
    the whole run (each starts 10 us after the last), so each covers every event."""
    events = []
    for i in range(n):
        events.append(_x(STEP.format(i), i * 10, n * 10 if overlapping else 10))
        events.append(_x(FETCH, i * 10 + 1, 3))
        events.append(_x("k", i * 10 + 2, 5, cat="kernel", pid=1))
    return events


def _timed(events: list[dict]) -> float:
    started = time.perf_counter()
    trace.analyze(events)
    return time.perf_counter() - started


def test_heavily_overlapping_steps_cost_what_disjoint_ones_do():
    """20,000 ProfilerStep ranges that all overlap: each step's cut was a walk over
    every interval in it (quadratic: a 2.2 MB trace took 48 s). Now two bisections a
    figure, so it costs about what the same number of disjoint steps does."""
    n = 20_000
    disjoint = _timed(_steps_trace(n, overlapping=False))
    overlapping = _timed(_steps_trace(n, overlapping=True))
    assert overlapping < 3 * disjoint + 1.0, (overlapping, disjoint)


def test_overlapping_steps_count_each_wait_in_each_step_that_holds_it():
    a = trace.analyze(_steps_trace(50, overlapping=True))
    # Step i spans [10i, 10i + 500): the fetches of steps i..49 are in it.
    assert [s.data_wait for s in a.steps] == [3.0 * (50 - i) for i in range(50)]
    assert all(s.devices[1].busy == 5.0 * (50 - i) for i, s in enumerate(a.steps))


intervals = st.lists(
    st.tuples(st.integers(-50, 200), st.integers(0, 60)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=30,
)


@given(a=intervals, b=intervals, lo=st.integers(-60, 260), width=st.integers(0, 300))
def test_a_cover_cuts_as_clip_does(a, b, lo, width):
    from starvecheck.stages.trace.intervals import Cover, intersect

    x, y = union(a), union(b)
    hi = lo + width
    assert Cover(x).within(lo, hi) == pytest.approx(length(clip(x, lo, hi)))
    both = Cover(intersect(x, y)).within(lo, hi)
    assert both == pytest.approx(overlap(clip(x, lo, hi), clip(y, lo, hi)))


# -- folders, and time --------------------------------------------------------------


def test_a_folder_of_too_many_trace_files_is_one_line(tmp_path, monkeypatch):
    """100,000 tiny files were 100,000 ranks: 127 s and 1.1 GB. Past the bound, one
    line before any is read (the bound lowered here, as the count is what is tested)."""
    monkeypatch.setattr(trace_load, "MAX_FILES", 50)
    for i in range(51):
        (tmp_path / f"{i}.json").write_text("not read")
    line = one_line(run("profile", "--trace", str(tmp_path)))
    assert "more than 50 trace files, the most one run reads" in line


def test_the_default_file_bound_lists_ten_thousand_files():
    assert trace_load.MAX_FILES == 10_000


def test_a_trace_past_the_time_limit_is_one_line(tmp_path):
    path = _small(tmp_path)
    line = one_line(run("profile", "--trace", path, "--max-trace-seconds", "0.000000001"))
    assert "ran past the time limit of 1e-09 s; raise it with --max-trace-seconds" in line
    assert run("profile", "--trace", path, "--max-trace-seconds", "0").exit_code in (0, 1)


def test_the_time_limit_applies_with_trace_only(tmp_path):
    line = one_line(run("profile", "--max-trace-seconds", "5", str(tmp_path)))
    assert "--max-trace-seconds applies with --trace" in line


# -- remedies the commands have ------------------------------------------------------


def _options(command: str) -> set[str]:
    from typer.main import get_command

    from starvecheck.cli.main import app

    click = get_command(app).commands[command]  # type: ignore[attr-defined]
    return {o for p in click.params for o in getattr(p, "opts", [])}


@pytest.mark.parametrize("command", ["io", "loader", "profile", "doctor"])
def test_a_path_that_is_no_directory_suggests_only_the_command_s_options(tmp_path, command):
    """profile and doctor were told to use --existing, which they do not have."""
    path = tmp_path / "a-file"
    path.write_text("x")
    argv = [command, str(path)] if command != "doctor" else [command, "--only", "io", str(path)]
    line = one_line(run(*argv))
    named = set(re.findall(r"--[a-z][a-z-]+", line))
    assert named and named <= _options(command), (line, named - _options(command))
