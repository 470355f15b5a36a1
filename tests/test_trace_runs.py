"""`profile --trace` on folders as the profiler writes them (stages/trace/runs.py): a
file per rank per profiler cycle, a stray JSON beside the traces, files of two runs
in one folder, one rank of four. The 4-rank fixture is a real gloo job run here with
torchrun and a repeating schedule (tests/fixtures/traces/gloo/README.md)."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.stages.trace.load import Event, JobId, TraceFile
from starvecheck.stages.trace.runs import _spans, choose, split_runs
from tests.conftest import FIXTURES, run

GLOO = FIXTURES / "traces" / "gloo"
CYCLES = GLOO / "cycles"  # 4 ranks, 3 files each (repeat=0); rank 1's data is slow


def profile(*paths) -> tuple[dict, dict]:
    r = run("profile", "--trace", *map(str, paths), "--json", "-")
    assert r.exit_code in (0, 1), r.stderr
    (stage,) = json.loads(r.stdout)["stages"]
    return stage, by_id(stage["caveats"])


# The JSON carries caveats as text: each kind is known by its words.
WORDS = {
    "trace.cycles": "one per profiler cycle",
    "trace.skipped": "are not traces and were skipped",
    "trace.mixed-runs": "never compared as one job",
    "trace.other-runs": "on its own:",
    "trace.missing-ranks": "have no trace here",
}


def by_id(caveats: list[str]) -> dict[str, str]:
    return {k: c for c in caveats for k, words in WORDS.items() if words in c}


def test_a_repeating_schedule_is_each_rank_s_cycles_and_names_the_straggler():
    stage, caveats = profile(CYCLES)
    p = stage["parameters"]
    assert [r["rank"] for r in p["ranks"]] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert p["world_size"] == 4 and len(p["runs"]) == 1 and p["runs"][0]["files"] == 12
    # Steps of both full cycles are compared (the closing stub, #12, is left out).
    assert p["common_steps"] == [f"ProfilerStep#{n}" for n in (2, 3, 4, 7, 8, 9)]
    assert "4 rank(s) wrote 3 files each, one per profiler cycle" in caveats["trace.cycles"]
    assert "trace.missing-ranks" not in caveats and "trace.mixed-runs" not in caveats
    (straggler,) = [f for f in stage["findings"] if f["id"] == "profile.straggler"]
    assert straggler["fix"]["rank"] == "rank 1" and straggler["fix"]["cause"] == "data wait"


def test_a_stray_json_beside_the_traces_is_skipped_with_a_note(tmp_path):
    for f in CYCLES.iterdir():
        shutil.copy(f, tmp_path)
    (tmp_path / "metrics.json").write_text('{"loss": 1.0}')
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "notes.txt").write_text("not a json name: not even listed")
    stage, caveats = profile(tmp_path)
    assert len(stage["parameters"]["ranks"]) == 4
    note = caveats["trace.skipped"]
    assert note.startswith("2 file(s) in the folder are not traces and were skipped")
    assert "metrics.json (not a Chrome trace (no traceEvents))" in note and "broken.json" in note
    assert "notes.txt" not in note
    # Named on the command line, the same file is an error: one line, exit 2.
    r = run("profile", "--trace", str(tmp_path / "metrics.json"))
    assert r.exit_code == 2 and r.stderr.strip().count("\n") == 0 and "no traceEvents" in r.stderr


def test_a_folder_of_nothing_but_stray_json_is_one_line(tmp_path):
    (tmp_path / "metrics.json").write_text("[1, 2]")
    r = run("profile", "--trace", str(tmp_path))
    assert r.exit_code == 2 and r.stderr.strip().count("\n") == 0
    assert "no trace among the files: metrics.json" in r.stderr


def test_two_runs_in_one_folder_are_never_one_job(tmp_path):
    for f in [*CYCLES.iterdir(), *(GLOO / "straggler").iterdir()]:
        shutil.copy(f, tmp_path)
    stage, caveats = profile(tmp_path)
    p = stage["parameters"]
    # The 4-rank run is the one analysed; the 2-rank run is named and judged apart.
    assert len(p["ranks"]) == 4 and p["world_size"] == 4
    assert [(r["world_size"], r["ranks"]) for r in p["runs"]] == [(4, [0, 1, 2, 3]), (2, [0, 1])]
    assert "the files are of 2 runs, never compared as one job" in caveats["trace.mixed-runs"]
    assert caveats["trace.other-runs"].startswith("run 2 on its own: rank 1 waits most for data")
    assert {f["fix"].get("rank") for f in stage["findings"] if f["id"] == "profile.straggler"} == {
        "rank 1"
    }


def test_two_runs_of_the_same_world_size_at_different_times_are_two_runs(tmp_path):
    for f in [*(GLOO / "straggler").iterdir(), *(GLOO / "rotating").iterdir()]:
        shutil.copy(f, tmp_path)
    stage, caveats = profile(tmp_path)
    assert len(stage["parameters"]["ranks"]) == 2 and len(stage["parameters"]["runs"]) == 2
    assert "trace.mixed-runs" in caveats


def test_one_rank_of_four_says_which_are_missing(tmp_path):
    for f in CYCLES.glob("rank2.*"):
        shutil.copy(f, tmp_path)
    stage, caveats = profile(tmp_path)
    assert stage["parameters"]["world_size"] == 4 and "ranks" not in stage["parameters"]
    assert caveats["trace.missing-ranks"].startswith(
        "3 of the job's 4 ranks have no trace here (rank(s) 0-1, 3): the figures are of "
        "rank(s) 2 alone"
    )
    assert "compared over the steps" not in caveats["trace.cycles"]


# Runs from files' distributedInfo, their processes and times (synthetic files).


def trace_file(rank, pid, start_s, world=2, groups="g", base_us=0.0, name=None):
    e = Event("X", "ProfilerStep#1", "user_annotation", start_s * 1e6, 1000.0, pid, 1)
    path = name or f"r{rank}-{pid}-{start_s}"
    return TraceFile(path, [e], rank, JobId(world, groups), base_us)


def test_a_restarted_rank_is_another_run():
    # rank 0 restarted (a new process) while rank 1 ran on: the same rank twice.
    files = [trace_file(0, 10, 100), trace_file(1, 11, 100), trace_file(0, 12, 100.5)]
    runs = split_runs(files)
    assert [sorted(r.ranks) for r in runs] == [[0, 1], [0]]


def test_cycles_on_another_clock_base_are_shifted_onto_the_first():
    a = trace_file(0, 10, 1.0, base_us=0.0)
    b = trace_file(0, 10, 1.0, base_us=5e6)  # the same process, its clock 5 s on
    (merged,), _, _ = choose([a, b])
    assert [e.ts for e in merged.events] == [1e6, 6e6]


def test_files_without_distributed_info_are_one_run_as_before():
    files = [TraceFile(f"f{i}", [Event("X", "x", None, 0, 1, 1, 1)]) for i in range(3)]
    merged, caveats, runs = choose(files)
    assert merged == files and caveats == [] and len(runs) == 1


def test_rank_spans():
    assert _spans([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7-8"
    assert _spans([2]) == "2" and _spans([]) == ""


@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(1, 4),
            st.integers(0, 2),
            st.floats(0, 1e4),
            st.booleans(),
        ),
        max_size=12,
    )
)
def test_property_every_file_is_in_exactly_one_run_and_no_run_repeats_a_rank(specs):
    files = [
        trace_file(rank, pid, start, world=2 + other, name=f"f{i}")
        for i, (rank, pid, _, start, other) in enumerate(specs)
    ]
    runs = split_runs(files)
    seen = [f.path for r in runs for f in r.files]
    assert sorted(seen) == sorted(f.path for f in files)
    for r in runs:
        assert len({f.job for f in r.files}) <= 1
        for rank, fs in r.ranks.items():
            assert all(f.rank == rank for f in fs)
    if files:
        _, _, again = choose(files)
        assert len(again) == len(runs)


@pytest.mark.parametrize(
    "garbage", [{"rank": "0"}, {"world_size": -1}, [], "x", {"pg_config": {1}}]
)
def test_distributed_info_of_any_shape_is_no_identity_error(tmp_path, garbage):
    trace = {
        "traceEvents": [{"ph": "X", "name": "ProfilerStep#0", "ts": 1, "dur": 2, "pid": 1}],
        "distributedInfo": garbage
        if not isinstance(garbage, dict) or "pg_config" not in garbage
        else {"pg_config": "odd"},
        "baseTimeNanoseconds": "not a number",
    }
    f = tmp_path / "t.json"
    f.write_text(json.dumps(trace))
    r = run("profile", "--trace", str(f), "--json", "-")
    assert r.exit_code in (0, 1), r.stderr
