"""`profile --trace`: reading a Chrome trace someone already has, the shares of step
time it holds, the advice on them, and the one-line refusals of files that are not
traces. The hand-made traces' figures are worked out in fixtures/traces/README.md."""

from __future__ import annotations

import dataclasses
import gzip
import json
import time
import warnings
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starvecheck.advice.judge import Results, attach, judge
from starvecheck.advice.trace import rules, workers_needed
from starvecheck.core.metric import Metric
from starvecheck.core.model import Severity, StageResult
from starvecheck.core.status import UsageError
from starvecheck.render import trace as trace_table
from starvecheck.stages import trace
from starvecheck.stages.base import RunContext
from tests.conftest import FIXTURES, run

TRACES = FIXTURES / "traces"
LOADER_LINE = "DataLoader(..., num_workers=N)"
GPU_METRICS = (
    "gpu_idle_share",
    "gpu_idle_data_wait_share",
    "gpu_idle_other_share",
    "memcpy_share",
)


def with_findings(r: StageResult) -> StageResult:
    """The result with the findings judging makes of it, as a report carries them."""
    return attach([r], judge(Results({r.stage: r})))[0]


def measure(path: Path | str) -> StageResult:
    """The trace stage as `profile --trace` runs it: plan, then measure."""
    from starvecheck.stages.options import TraceOptions

    ctx = RunContext()
    return trace.STAGE.measure(trace.STAGE.plan(TraceOptions((str(path),)), ctx), ctx)


def read(name: str) -> StageResult:
    return with_findings(measure(TRACES / name))


def values(r: StageResult) -> dict[str, float | None]:
    return {m.name: m.value for m in r.metrics}


def finding(r: StageResult | tuple, fid: str):
    found = r.findings if isinstance(r, StageResult) else r
    return next((f for f in found if f.id == fid), None)


# The hand-made traces


def test_cpu_only_trace_waits_30_percent():
    r = read("cpu_only.json")
    v = values(r)
    assert r.stage == "trace" and r.reported_as == "profile"
    assert r.parameters["trace"] == str(TRACES / "cpu_only.json")
    assert r.parameters["steps"] == 4 and r.parameters["warmup_steps"] == 1
    assert v["steps"] == 4
    assert v["data_wait_share"] == pytest.approx(0.30)
    assert r.metric("step_ms").values == (100.0, 100.0, 100.0)
    assert r.metric("data_wait_ms").values == (30.0, 30.0, 30.0)
    for name in GPU_METRICS:
        m = r.metric(name)
        assert m.value is None and m.reason == "no GPU kernels in the trace: a CPU-only run"
    assert not [m for m in r.metrics if m.name.startswith("phase_ms.")]
    assert any("left out as a warm-up" in c for c in r.caveats)
    assert r.has_caveat("trace.warmup-left-out")
    data = finding(r, "profile.data-bound")
    # 30% would be critical, but three measured steps are too few for a verdict.
    assert data.severity is Severity.INFO
    assert "3 of 3 steps" in data.evidence and "only 3 step(s) measured" in data.evidence
    assert "(a mean 30.0 ms of a mean 100.0 ms step)" in data.evidence
    assert "`DataLoader(..., num_workers=2)`" in data.recommendation and data.fix == {
        "num_workers": 2
    }
    assert finding(r, "profile.gpu-idle") is None


@pytest.mark.parametrize("name", ["gpu.json", "gpu.json.gz"])
def test_gpu_trace_splits_idle_time(name):
    r = read(name)
    v = values(r)
    assert v["steps"] == 3 and r.metric("step_ms").values == (100.0, 100.0)
    assert v["first_step_ms"] == pytest.approx(400.0)
    assert v["data_wait_share"] == pytest.approx(0.30)
    assert v["gpu_idle_share"] == pytest.approx(0.41)
    assert v["gpu_idle_data_wait_share"] == pytest.approx(0.30)
    assert v["gpu_idle_other_share"] == pytest.approx(0.11)
    assert v["memcpy_share"] == pytest.approx(0.12)
    assert v["memcpy_h2d_share"] == pytest.approx(0.12)
    assert v["memcpy_h2d_pageable_share"] == pytest.approx(0.12)
    assert v["memcpy_d2d_share"] == v["memcpy_d2h_share"] == 0
    phases = {"dataloader_wait": 30, "h2d_transfer": 12, "forward": 28, "backward": 20}
    for phase, ms in {**phases, "optimizer": 10}.items():
        assert r.metric(f"phase_ms.{phase}").values == (pytest.approx(ms), pytest.approx(ms))
    assert r.parameters["data_wait_source"] == "DATALOADER_WAIT and DataLoader.__next__"
    ids = {f.id: f.severity for f in r.findings}
    assert ids == {
        "profile.data-bound": Severity.INFO,  # two measured steps: too few for a verdict
        "profile.memcpy": Severity.WARNING,
        "profile.first-step-stall": Severity.INFO,
    }
    assert "pin_memory=True" in finding(r, "profile.memcpy").recommendation


def test_nested_and_overlapping_fetches_count_once():
    r = read("nested.json")
    assert values(r)["data_wait_share"] == pytest.approx(0.40)
    assert r.metric("data_wait_ms").values == (pytest.approx(50.0), pytest.approx(30.0))
    assert r.parameters["warmup_steps"] == 0
    assert r.parameters["dataloader"] == "_MultiProcessingDataLoaderIter"
    assert any("20.0 ms of DataLoader fetches fall outside" in c for c in r.caveats)
    assert any("only 2 steps" in c for c in r.caveats)
    for caveat in ("trace.fetches-outside-steps", "timing.too-few-runs", "trace.main-process-only"):
        assert r.has_caveat(caveat), caveat
    assert "`starvecheck starve`" in finding(r, "profile.data-bound").recommendation


def test_interval_union_and_clip():
    merged = trace.union([(15, 35), (10, 40), (30, 50), (90, 120), (150, 160), (150, 160)])
    assert merged == [(10, 50), (90, 120), (150, 160)]
    assert trace.clip(merged, 100, 200) == [(100, 120), (150, 160)]
    assert trace.clip(merged, 40, 95) == [(40, 50), (90, 95)]
    assert trace.clip(merged, 50, 90) == []
    assert trace.overlap(merged, [(0, 20), (45, 155)]) == 10 + 5 + 30 + 5


def test_without_profiler_steps_the_trace_is_one_step():
    events = [
        e for e in trace.load_events(TRACES / "cpu_only.json") if "ProfilerStep" not in e.name
    ]
    a = trace.analyze(events)
    assert a.whole_trace and len(a.steps) == 1
    # From the first fetch at 5 ms to the last aten::mm's end at 390 ms; 4 fetches of 30 ms.
    assert a.steps[0].dur == pytest.approx(385_000)
    assert a.data_wait_share == pytest.approx(120 / 385)
    assert any("no ProfilerStep events" in c for c in a.caveats)
    assert any(c.id == "trace.whole-trace" for c in a.caveats)


def test_a_trace_that_starts_after_step_0_has_no_warmup_to_leave_out():
    events = [
        msgspec.structs.replace(e, name=f"ProfilerStep#{int(e.name[-1]) + 3}")
        if e.name.startswith("ProfilerStep")
        else e
        for e in trace.load_events(TRACES / "cpu_only.json")
    ]
    a = trace.analyze(events)
    assert a.warmup == 0 and len(a.measured) == 4
    assert a.data_wait_share == pytest.approx(0.30)
    assert trace.result(a, "x.json").metric("first_step_ms") is None


def test_gpu_user_annotations_are_not_steps():
    a = trace.analyze(trace.load_events(TRACES / "gpu.json"))
    assert [s.name for s in a.steps] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]


def test_no_dataloader_in_the_trace_means_no_data_figure():
    events = [e for e in trace.load_events(TRACES / "cpu_only.json") if "DataLoader" not in e.name]
    r = trace.result(trace.analyze(events), "x.json")
    m = r.metric("data_wait_share")
    assert m.value is None and "no DataLoader fetch" in m.reason
    assert finding(r, "profile.data-bound") is None
    assert any("DATALOADER_WAIT" in c for c in r.caveats)
    assert r.has_caveat("trace.no-dataloader")


def test_steps_of_several_processes_are_ranks_apart():
    events = trace.load_events(TRACES / "cpu_only.json")
    other = [msgspec.structs.replace(e, pid=2) for e in events if e.name == "ProfilerStep#0"]
    job = trace.analyze_job([trace.TraceFile("x.json", events + other)])
    assert [len(a.steps) for a in job.ranks] == [4, 1]
    assert [a.name for a in job.ranks] == ["pid 1", "pid 2"]
    assert any(c.id == "trace.several-processes" for c in job.caveats)
    assert job.headline.name == "pid 1"  # the one that waits for data


def test_a_stored_report_is_judged_as_a_fresh_one():
    r = read("gpu.json")
    back = StageResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert with_findings(back).findings == r.findings


# Labels: what the table and the rules select by


def test_every_figure_is_labelled_with_its_quantity():
    r = measure(TRACES / "gpu.json")
    for m in r.metrics:
        if m.labels["quantity"] == "phase_ms":
            assert set(m.labels) == {"quantity", "phase"}, m.name
        else:
            assert m.labels == {"quantity": m.name}, m.name  # one of a kind


def _renamed(r: StageResult) -> StageResult:
    """The same figures under other names: the table and the rules must not notice."""
    metrics = tuple(dataclasses.replace(m, name=f"figure{i}") for i, m in enumerate(r.metrics))
    return dataclasses.replace(r, metrics=metrics)


@pytest.mark.parametrize("name", ["gpu.json", "cpu_only.json", "nested.json"])
def test_table_and_rules_select_by_labels_not_names(name):
    r = measure(TRACES / name)
    renamed = _renamed(r)
    rows, rest, _ = trace_table.split(r, r.metrics)
    assert rows and trace_table.split(renamed, renamed.metrics)[0] == rows
    assert [m.name for m in rest] == []  # the breakdown takes every figure
    found = rules(Results({"trace": r}))
    assert found and rules(Results({"trace": renamed})) == found


def test_figures_with_a_layout_are_no_breakdown():
    # profile's loop labels the same quantities with a layout and num_workers: its own
    # table and rules (advice/profile) take them, not the breakdown's.
    r = measure(TRACES / "gpu.json")
    loop = dataclasses.replace(
        r, metrics=tuple(m.labelled(layout="mds", workers=0) for m in r.metrics)
    )
    assert trace_table.split(loop, loop.metrics)[0] == []
    assert rules(Results({"trace": loop})) == []
    # and another stage's figures, whatever their labels, are not read as a step's
    other = dataclasses.replace(r, stage="starve")
    assert trace_table.split(other, other.metrics)[0] == []


# Refusals: one line naming the file


def _refused(path: Path, *expected: str) -> str:
    with pytest.raises(UsageError) as e:
        trace.load_events(path)
    message = str(e.value)
    assert message.startswith(f"--trace {path}: ") and "\n" not in message
    for text in expected:
        assert text in message
    return message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"displayTimeUnit": "ms"}', "not a Chrome trace (no traceEvents)"),
        (b'{"traceEvents": {"ph": "X"}}', "traceEvents is not a list"),
        (b"42", "a JSON int"),
        (b"[]", "no timed events"),
        (b'{"traceEvents": [{"ph": "i", "ts": 1}, {"ph": "X", "ts": 1}, 3]}', "no timed events"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2},', "not JSON"),
        (b'[{"ph": "X", "ts": 1' + b"0" * 400 + b', "dur": 1}]', "past 2^53 us"),
        (b'[{"ph": "X", "ts": 1e999, "dur": 1}, {"ph": "X", "ts": 1, "dur": -1}]', "past 2^53"),
        (b'[{"ph": "X", "ts": true, "dur": 1}, {"ph": "X", "ts": "1", "dur": 1}]', "no timed"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"\x1f\x8b\x08\x00 not really gzip", "gzip"),
        (gzip.compress(b'{"traceEvents": [', mtime=0)[:-10], "gzip"),
        (gzip.compress(b"not json", mtime=0), "not JSON"),
    ],
)
def test_files_that_are_not_traces_are_one_line(tmp_path, content, expected):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    _refused(path, expected)


def test_traces_kineto_writes_not_quite_as_json_are_mended(tmp_path):
    """Windows paths unescaped in with_stack frames, bytes that are not UTF-8 and raw
    control characters in names: the names suffer, the times are read."""
    step = b'{"ph": "X", "name": "ProfilerStep#1", "ts": 0, "dur": 100},'
    names = b'"torch\\cuda\\__init__.py(219): _lazy_init \xff\x01 C:\\users"'
    fetch = b'{"ph": "X", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"'
    path = tmp_path / "windows.json"
    path.write_bytes(
        b'{"traceEvents": [' + step + b'{"ph": "X", "cat": "python_function", "name": '
        + names + b', "ts": 1, "dur": 2},' + fetch + b', "ts": 10, "dur": 40}]}'
    )  # fmt: skip
    events = trace.load_events(path)
    assert "_lazy_init" in events[1].name
    assert trace.analyze(events).data_wait_share == pytest.approx(0.4)


def test_missing_file_and_directory_are_one_line(tmp_path):
    _refused(tmp_path / "absent.json", "no such file")
    _refused(tmp_path, "is a directory")


def test_a_trace_spanning_no_time_is_refused_by_name(tmp_path):
    path = tmp_path / "zero.json"
    path.write_text(json.dumps([{"ph": "X", "name": "a", "ts": 5, "dur": 0}]))
    with pytest.raises(UsageError, match=r"^--trace .*zero\.json: the trace's events span"):
        measure(path)


# Advice thresholds, from metrics alone


def judged(**figures) -> tuple:
    metrics = []
    for name, v in figures.items():
        labels = {"quantity": name}
        if isinstance(v, tuple):
            metrics.append(Metric.repeated(name, v, "ms", labels))
        else:
            metrics.append(Metric.single(name, v, "fraction", labels))
    result = StageResult("trace", {"trace": "x.json"}, tuple(metrics))
    return tuple(rules(Results({"trace": result})))


@pytest.mark.parametrize(
    ("share", "severity"),
    [
        (0.0, Severity.OK),
        (0.05, Severity.OK),
        (0.0501, Severity.WARNING),
        (0.20, Severity.WARNING),
        (0.2001, Severity.CRITICAL),
    ],
)
def test_data_bound_thresholds(share, severity):
    f = finding(judged(data_wait_share=share), "profile.data-bound")
    assert f.severity is severity
    assert f.gain.value == pytest.approx(share)
    if severity is Severity.CRITICAL:
        assert "highly input-bound" in f.title
    elif severity is Severity.WARNING:
        assert "moderately input-bound" in f.title
        assert LOADER_LINE in f.recommendation
        for command in ("loader", "starve", "io", "pad"):
            assert f"`starvecheck {command}`" in f.recommendation


def test_data_bound_counts_the_steps_that_wait():
    f = finding(
        judged(
            data_wait_share=0.1,
            data_wait_ms=(1.0, 5.0, 6.0, 30.0),
            step_ms=(100.0, 100.0, 100.0, 100.0),
        ),
        "profile.data-bound",
    )
    assert "2 of 4 steps wait more than 5%" in f.evidence


def test_workers_needed():
    assert workers_needed(30, 100) == 2  # 0.43 workers keep level: at least 2
    assert workers_needed(80, 100) == 5  # 4 keep level, one spare
    assert workers_needed(100, 100) is None


@pytest.mark.parametrize(
    ("idle", "host", "other", "severity"),
    [
        (0.20, 0.0, 0.20, None),  # not above 20%
        (0.30, 0.20, 0.10, None),  # mostly waiting for data
        (0.30, 0.15, 0.15, None),  # half: not mostly other
        (0.30, 0.05, 0.25, Severity.WARNING),
        (0.70, 0.10, 0.60, Severity.CRITICAL),
    ],
)
def test_gpu_idle_thresholds(idle, host, other, severity):
    f = finding(
        judged(
            gpu_idle_share=idle,
            gpu_idle_data_wait_share=host,
            gpu_idle_other_share=other,
        ),
        "profile.gpu-idle",
    )
    assert (f.severity if f else None) is severity
    if f:
        assert f.gain.value == pytest.approx(other)


def test_gpu_idle_without_a_fetch_is_all_unexplained():
    f = finding(judged(gpu_idle_share=0.4), "profile.gpu-idle")
    assert f.severity is Severity.WARNING and f.gain.value == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("share", "pageable", "fires"),
    [(0.10, 0.10, False), (0.11, 0.11, True), (0.11, 0.0, True)],
)
def test_memcpy_threshold(share, pageable, fires):
    f = finding(judged(memcpy_share=share, memcpy_pageable_share=pageable), "profile.memcpy")
    assert (f is not None) is fires
    if f:
        assert f.severity is Severity.WARNING
        assert ("pin_memory=True" in f.recommendation) is (pageable > 0)
        assert "non_blocking=True" in f.recommendation


@pytest.mark.parametrize(("first", "fires"), [(300.0, False), (301.0, True)])
def test_first_step_stall(first, fires):
    f = finding(
        judged(first_step_ms=first, step_ms=(90.0, 100.0, 110.0)), "profile.first-step-stall"
    )
    assert (f is not None) is fires
    if f:
        assert f.severity is Severity.INFO


def test_nothing_measured_nothing_said():
    assert judged() == ()


# A real trace, written by torch.profiler here


def test_a_real_torch_profiler_trace(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, record_function, schedule

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int):
            time.sleep(0.005)  # 5 ms a sample, 20 ms a batch of 4
            return torch.zeros(8)

    loader = torch.utils.data.DataLoader(Slow(), batch_size=4, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle"
        with torch.profiler.profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=4),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tmp_path)),
        ) as prof:
            for i, batch in enumerate(loader):
                with record_function("FORWARD"):
                    time.sleep(0.02)
                    batch.sum()
                prof.step()
                if i == 4:  # one warm-up step and four active ones
                    break
    (path,) = tmp_path.glob("*.pt.trace.json")
    r = with_findings(measure(path))
    v = values(r)
    assert v["steps"] == 4
    # ProfilerStep#1 to #4: the schedule's warm-up step was #0, so all four are measured.
    assert r.parameters["warmup_steps"] == 0 and r.metric("step_ms").n == 4
    assert 0.3 < v["data_wait_share"] < 0.7
    assert r.parameters["dataloader"] == "_SingleProcessDataLoaderIter"
    assert r.metric("gpu_idle_share").reason == trace.NO_GPU
    assert r.metric("phase_ms.forward").median == pytest.approx(20, abs=15)
    # Four steps: too few for a verdict, said in the evidence.
    assert finding(r, "profile.data-bound").severity is Severity.INFO


# Garbage in: a usage error, nothing else


def _load_or_refuse(path: Path) -> None:
    try:
        events = trace.load_events(path)
    except UsageError as e:
        assert "\n" not in str(e)
        return
    assert events and all(isinstance(e, trace.Event) for e in events)
    _analyze_or_refuse(events)


def _analyze_or_refuse(events) -> None:
    try:
        a = trace.analyze(events)
    except UsageError:
        return
    r = trace.result(a, "x.json")
    for name in ("data_wait_share", *GPU_METRICS):
        v = r.metric(name).value
        assert v is None or -1e-9 <= v <= 1 + 1e-9, (name, v)
    idle, host, other = (r.metric(n).value for n in GPU_METRICS[:3])
    if idle is not None and host is not None and host <= idle:
        assert host + other == pytest.approx(idle)


SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
NAMES = [
    "ProfilerStep#x",
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
    "DATALOADER_WAIT",
    "FORWARD",
    "Memcpy HtoD (Pageable -> Device)",
    "aten::mm",
]
CATEGORIES = ["user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset"]
numbers = st.one_of(
    st.integers(0, 1000),  # twice as likely: timed events, so steps, fetches and kernels meet
    st.integers(0, 1000),
    st.integers(-10, 10**18),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=3),
)
events = st.lists(
    st.fixed_dictionaries(
        {
            "ph": st.sampled_from(["X", "X", "X", "i", "M", "B"]),
            "name": st.sampled_from(["ProfilerStep#0", "ProfilerStep#1", *NAMES]),
            "cat": st.sampled_from([*CATEGORIES, 3]),
            "ts": numbers,
            "dur": numbers,
            "pid": st.sampled_from([0, 1, "1", None]),
        }
    ),
    max_size=30,
)


@SETTINGS
@given(content=st.binary(max_size=300))
def test_random_bytes_are_a_usage_error_at_worst(tmp_path, content):
    path = tmp_path / "random.json"
    path.write_bytes(content)
    _load_or_refuse(path)
    path.write_bytes(gzip.compress(content))
    _load_or_refuse(path)


@SETTINGS
@given(value=json_values, wrap=st.booleans())
def test_random_json_is_a_usage_error_at_worst(tmp_path, value, wrap):
    path = tmp_path / "random.json"
    path.write_text(json.dumps({"traceEvents": value} if wrap else value))
    _load_or_refuse(path)


@SETTINGS
@given(evs=events)
def test_random_events_give_shares_between_0_and_1(tmp_path, evs):
    path = tmp_path / "events.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    _load_or_refuse(path)


timed_events = st.lists(
    st.builds(
        lambda name, cat, ts, dur, pid: {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": ts,
            "dur": dur,
            "pid": pid,
        },
        st.sampled_from(["ProfilerStep#1", "ProfilerStep#2", *NAMES]),
        st.sampled_from(CATEGORIES),
        st.integers(0, 1000) | st.floats(0, 1000),
        st.integers(0, 300) | st.floats(0, 300),
        st.sampled_from([0, 1]),
    ),
    min_size=1,
    max_size=40,
)


@SETTINGS
@given(evs=timed_events)
def test_every_step_share_is_a_share(evs):
    """Whatever overlaps whatever, no step waits or idles longer than it lasts."""
    _analyze_or_refuse(evs)
    try:
        a = trace.analyze(evs)
    except UsageError:
        return  # every event of no length
    for s in a.steps:
        assert 0 <= s.data_wait <= s.dur * (1 + 1e-9)
        for d in s.devices.values():
            assert 0 <= d.idle_data_wait <= s.data_wait * (1 + 1e-9) + 1e-9
            assert d.busy <= s.dur * (1 + 1e-9)
            assert d.memcpy <= d.busy * (1 + 1e-9) + 1e-9


def test_copies_at_once_count_once():
    # Found by the property above: two copies on two streams over the same 40 us.
    step = {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100}
    copy = {"ph": "X", "cat": "gpu_memcpy", "ts": 10, "dur": 40, "pid": 0}
    evs = [
        {**step, "pid": 1},
        {**copy, "name": "Memcpy HtoD (Pinned -> Device)", "tid": 7},
        {**copy, "name": "Memcpy DtoD (Device -> Device)", "tid": 8},
    ]
    r = trace.result(trace.analyze(evs), "x.json")
    assert r.metric("memcpy_share").value == pytest.approx(0.4)


# The command line: `starvecheck profile --trace FILE`


def test_cli_reports_the_known_shares_of_a_gzipped_trace():
    r = run("profile", "--trace", str(TRACES / "gpu.json.gz"), "--json", "-")
    assert r.exit_code == 0, r.stderr
    (stage,) = r.json["stages"]
    got = {m["name"]: m["value"] for m in stage["metrics"]}
    assert got["step_ms"] == pytest.approx(100)
    assert got["data_wait_share"] == pytest.approx(0.30)
    assert got["gpu_idle_share"] == pytest.approx(0.41)
    assert got["gpu_idle_data_wait_share"] == pytest.approx(0.30)
    assert got["memcpy_share"] == pytest.approx(0.12)
    assert r.json["machine"] == {}  # the trace is another machine's run, not this one's
    assert r.json["checklist"][0]["id"] == "profile.data-bound"


def test_cli_terminal_report_breaks_the_step_down():
    r = run("profile", "--trace", str(TRACES / "gpu.json"))
    assert r.exit_code == 0, r.stderr
    rows = {line.strip().split("  ")[0]: line for line in r.stdout.splitlines()}
    assert rows["step (2 of 3 measured)"].rstrip().endswith("100.0%")
    assert rows["GPU idle"].rstrip().endswith("41.0%")
    assert rows["↳ other (launches, syncs, host code)"].rstrip().endswith("11.0%")
    assert "400.0" in rows["first step (left out)"]
    assert "[profile.first-step-stall]" in r.stdout


def test_cli_json_labels_every_metric_with_its_quantity():
    r = run("profile", "--trace", str(TRACES / "gpu.json"), "--json", "-")
    assert r.exit_code == 0, r.stderr
    assert r.json["schema_version"] == 3
    (stage,) = r.json["stages"]
    assert stage["stage"] == "profile"  # as schema 1 named it
    for m in stage["metrics"]:
        assert m["labels"] and m["labels"]["quantity"], m["name"]


def test_cli_fail_on_gates_a_ci_job_on_a_trace():
    # The GPU trace's pageable copies are a warning; its three steps of data wait are
    # too few for more than info.
    r = run("profile", "--trace", str(TRACES / "gpu.json"), "--fail-on", "warning")
    assert r.exit_code == 1
    r = run("profile", "--trace", str(TRACES / "cpu_only.json"), "--fail-on", "warning")
    assert r.exit_code == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "drop --workers"),
        (["--cold", "--steps", "3"], "drop --steps, --cold"),
        (["--device", "cpu"], "drop --device"),
        (["somewhere"], "drop PATH"),
        (["--tokenizer", "gpt2"], "drop --tokenizer"),
    ],
)
def test_cli_trace_with_loop_options_is_one_line(argv, message):
    r = run("profile", "--trace", str(TRACES / "gpu.json"), *argv)
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1


def test_cli_missing_trace_is_one_line(tmp_path):
    r = run("profile", "--trace", str(tmp_path / "nope.json"))
    assert r.exit_code == 2
    assert r.stderr == f"starvecheck: error: --trace {tmp_path / 'nope.json'}: no such file\n"
