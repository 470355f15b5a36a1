"""`profile --trace` on real public traces (HolisticTraceAnalysis's tests/data, MIT;
tests/fixtures/traces/hta/README.md) and on hand-made multi-rank jobs: every rank
and GPU apart, a stub last step left out, copies by direction, stragglers."""

from __future__ import annotations

import gzip
import json

import pytest

from starvecheck.advice.results import Results
from starvecheck.advice.trace import rules
from starvecheck.core.model import Severity
from starvecheck.stages import trace
from tests.conftest import FIXTURES, run

HTA = FIXTURES / "traces" / "hta"
RANKS = HTA / "ranks"


def measured(*paths):
    job = trace.read([str(p) for p in paths])
    return job, trace.result(job, [str(p) for p in paths])


def findings(r):
    return {f.id: f for f in rules(Results({"trace": r}))}


def by_rank(r, quantity):
    return {
        m.labels["rank"]: m.value
        for m in r.metrics
        if m.labels.get("quantity") == quantity and "rank" in m.labels
    }


def test_a_stub_last_step_is_left_out():
    # ROCm MI250: ProfilerStep#1 9.29 ms, then #2 0.05 ms (the profiler closing).
    _, r = measured(HTA / "mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert r.metric("step_ms").values == (pytest.approx(9.288291),)
    assert r.parameters["stub_steps"] == 1 and r.has_caveat("trace.stub-last-step")
    # One step, 98% idle: said, but no verdict on a single step.
    assert findings(r)["profile.gpu-idle"].severity is Severity.INFO


def test_a_directory_of_ranks_is_reported_rank_by_rank():
    job, r = measured(RANKS)
    assert [a.name for a in job.ranks] == ["rank 0", "rank 1"]
    idle = by_rank(r, "gpu_idle_share")
    assert idle == {
        "rank 0": pytest.approx(0.555, abs=0.002),
        "rank 1": pytest.approx(0.532, abs=0.002),
    }
    # The headline is one rank's, never a mix of both.
    assert r.parameters["headline_rank"] == "rank 0"
    assert r.metric("gpu_idle_share").value == idle["rank 0"]
    collectives = by_rank(r, "collective_share")
    assert all(0.25 < v < 0.4 for v in collectives.values())
    # HTA 0.5.0, TraceAnalysis(include_last_profiler_step=True).get_idle_time_breakdown
    # on rank 0: host wait 83.32%, kernel wait 0.09%, other 16.59% of the streams' idle.
    assert r.metric("hta_idle_host_wait_ratio").value == pytest.approx(0.8332, abs=5e-4)
    assert r.metric("hta_idle_kernel_wait_ratio").value == pytest.approx(0.0009, abs=5e-4)
    assert r.metric("hta_idle_other_ratio").value == pytest.approx(0.1659, abs=5e-4)
    # Two steps on each rank, no straggler by the 80% rule.
    assert "profile.straggler" not in findings(r)


def test_a_file_merging_two_ranks_is_split_by_process(tmp_path):
    events = []
    for f in sorted(RANKS.glob("*.json.gz")):
        with gzip.open(f) as raw:
            events += json.load(raw)["traceEvents"]
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps({"traceEvents": events}))
    job, r = measured(merged)
    assert [(a.name, a.devices) for a in job.ranks] == [("pid 4037", (0,)), ("pid 4045", (1,))]
    idle = by_rank(r, "gpu_idle_share")
    assert idle == {
        "pid 4037": pytest.approx(0.555, abs=0.002),
        "pid 4045": pytest.approx(0.532, abs=0.002),
    }
    assert r.has_caveat("trace.several-processes")


def test_pinned_copies_get_no_pinning_advice_and_device_copies_count_apart():
    _, r = measured(HTA / "trace_diff_control.json.gz")
    assert r.metric("memcpy_h2d_pageable_share").value == 0
    assert r.metric("memcpy_d2d_share").value > 0
    f = findings(r)["profile.memcpy"]
    assert "pin_memory" not in f.recommendation and f.fix == {}
    assert "every host-to-device copy is from pinned memory" in f.evidence
    assert "device-to-device" in f.evidence


def test_gpu_work_after_the_last_step_is_said():
    _, r = measured(HTA / "negative_queue_rank0.json.gz")
    assert r.has_caveat("trace.gpu-after-last-step")
    assert any("runs after the last step" in c for c in r.caveats)


def _rank_file(tmp_path, rank, waits, steps=12, step_us=100_000):
    """A synchronous job's rank: each step fetches for `waits[i]` us, computes, then an
    all-reduce kernel that ends with the step (the fast rank waits there)."""
    ev = []
    for i in range(steps):
        t0 = i * step_us
        w = waits[i % len(waits)]
        ev.append(
            {
                "ph": "X",
                "name": f"ProfilerStep#{i + 1}",
                "cat": "user_annotation",
                "ts": t0,
                "dur": step_us,
                "pid": 10 + rank,
                "tid": 1,
            }
        )
        ev.append(
            {
                "ph": "X",
                "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                "cat": "user_annotation",
                "ts": t0,
                "dur": w,
                "pid": 10 + rank,
                "tid": 1,
            }
        )
        ev.append(
            {
                "ph": "X",
                "name": "gemm",
                "cat": "kernel",
                "ts": t0 + w,
                "dur": 30_000,
                "pid": rank,
                "tid": 7,
            }
        )
        ev.append(
            {
                "ph": "X",
                "name": "ncclKernel_AllReduce_RING_LL_Sum_float",
                "cat": "kernel",
                "ts": t0 + w + 30_000,
                "dur": step_us - w - 30_000,
                "pid": rank,
                "tid": 9,
            }
        )
    path = tmp_path / f"rank{rank}.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": rank}, "traceEvents": ev}))  # fmt: skip
    return path


def test_a_straggler_rank_is_named_with_its_cause(tmp_path):
    fast = [_rank_file(tmp_path, r, [5_000]) for r in (0, 1, 2)]
    slow = _rank_file(tmp_path, 3, [50_000])
    _, r = measured(tmp_path)
    f = findings(r)
    s = f["profile.straggler"]
    assert s.title.startswith("rank 3 is a straggler") and s.severity is Severity.WARNING
    assert "waits for data longer" in s.recommendation
    assert s.gain.value == pytest.approx(0.45, abs=0.01)
    assert "profile.straggler-rotating" not in f
    assert r.parameters["headline_rank"] == "rank 3"
    assert fast and slow


def test_a_straggler_that_rotates_between_ranks(tmp_path):
    # Each rank is slow one step in two, in turn: no rank stands out on average.
    _rank_file(tmp_path, 0, [50_000, 5_000])
    _rank_file(tmp_path, 1, [5_000, 50_000])
    _, r = measured(tmp_path)
    f = findings(r)
    assert "profile.straggler" not in f
    rot = f["profile.straggler-rotating"]
    assert rot.severity is Severity.WARNING and "12 of 12 steps" in rot.evidence
    assert "rank 0 (6 steps)" in rot.evidence and "rank 1 (6 steps)" in rot.evidence


def test_accelerators_not_timed_are_not_called_cpu_only(tmp_path):
    path = tmp_path / "mtia.json"
    step = {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 10}
    dma = {"ph": "X", "name": "dma_request", "cat": "mtia_ccp_events", "ts": 1, "dur": 2}
    path.write_text(json.dumps({"traceEvents": [{**step, "pid": 1}, {**dma, "pid": 9}]}))
    _, r = measured(path)
    assert (
        "MTIA" in r.metric("gpu_idle_share").reason
        and "CPU-only" not in r.metric("gpu_idle_share").reason
    )


def test_cli_reads_a_directory_and_repeated_files():
    r = run("profile", "--trace", str(RANKS))
    assert r.exit_code == 0, r.stderr
    assert "every rank" in r.stdout and "rank 1" in r.stdout
    files = sorted(str(p) for p in RANKS.glob("*.json.gz"))
    again = run("profile", "--trace", files[0], "--trace", files[1], "--json", "-")
    assert again.exit_code == 0, again.stderr
    assert len(again.json["stages"][0]["parameters"]["ranks"]) == 2


def test_cli_an_empty_directory_is_one_line(tmp_path):
    r = run("profile", "--trace", str(tmp_path))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "no trace files" in r.stderr


GLOO = FIXTURES / "traces" / "gloo"  # a real 2-rank gloo job, written here (README.md there)


def test_a_real_two_rank_job_names_its_straggler():
    _, r = measured(GLOO / "straggler")
    collectives = by_rank(r, "collective_share")
    # The fast rank spends its step in gloo's all_reduce, waiting for the slow one.
    assert collectives["rank 0"] > 0.8 and collectives["rank 1"] < 0.3
    waits = by_rank(r, "data_wait_share")
    assert waits["rank 1"] > 0.6 and waits["rank 0"] < 0.05
    f = findings(r)
    s = f["profile.straggler"]
    assert s.title.startswith("rank 1 is a straggler")
    assert "waits for data longer" in s.recommendation
    assert "profile.straggler-rotating" not in f
    assert f["profile.data-bound"].evidence.startswith("on rank 1, of 2 ranks")


def test_a_real_job_whose_slow_rank_rotates():
    _, r = measured(GLOO / "rotating")
    f = findings(r)
    assert "profile.straggler" not in f
    rot = f["profile.straggler-rotating"]
    assert "rank 0 (6 steps)" in rot.evidence and "rank 1 (6 steps)" in rot.evidence


def test_cli_names_the_straggler_of_a_real_job():
    r = run("profile", "--trace", str(GLOO / "straggler"))
    assert r.exit_code == 0, r.stderr
    assert "rank 1 is a straggler" in r.stdout
    assert "12 of 12" in r.stdout  # rank 1 is the slowest in every step


def test_a_fast_last_step_that_fetched_data_is_a_real_step():
    # Steps of 100, 100 and 5 ms, each with a DataLoader fetch: the last one found its
    # batch ready. Only a last step with no work in it is the profiler closing.
    events = []
    for i, (t0, dur) in enumerate(((0, 100_000), (100_000, 100_000), (200_000, 5_000))):
        step = {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1}
        events.append({**step, "name": f"ProfilerStep#{i + 1}", "ts": t0, "dur": dur})
        fetch = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
        events.append({**step, "name": fetch, "ts": t0, "dur": 1_000})
    a = trace.analyze(events)
    assert a.stub == 0 and len(a.measured) == 3
    a = trace.analyze(events[:-1])  # the last step without its fetch: a stub
    assert a.stub == 1 and len(a.measured) == 2


def test_the_pace_of_ranks_alike_is_the_expected_slowest():
    from starvecheck.advice.stragglers import paced

    assert paced([5.0, 5.0, 5.0], 4) == pytest.approx(5.0)  # alike every step
    assert paced([1.0, 3.0], 1) == pytest.approx(2.0)  # one rank: its mean
    # two ranks drawing 1 or 2: the slower is 1 only when both draw 1 (1 in 4)
    assert paced([1.0, 2.0], 2) == pytest.approx(0.25 * 1 + 0.75 * 2)
    assert paced([1.0, 2.0, 9.0], 64) == pytest.approx(9.0, rel=1e-9)  # many: the worst
