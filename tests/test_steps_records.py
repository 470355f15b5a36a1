"""A step breakdown's figures as records (core/schema/steps.py: profile's loop, profile
--trace, watch) and a loop's wait by stage (core/schema/loading.py): the JSON's metrics
are their serialisation, so a stored report's metrics read and written again are the
same metrics, byte for byte, in the order the stage wrote them."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.report import Report
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import EXPOSED_SHARE, LoadFigures, LoadStage
from starvecheck.core.schema.steps import (
    Layout,
    Phase,
    ProfileFigures,
    Scenario,
    Step,
    StepFigure,
    StepFigures,
)
from starvecheck.loading.tap import Startup
from starvecheck.loop.splits import StageSplit

GOLDEN = Path(__file__).parent / "golden"
STORED = {
    "profile-quick": ProfileFigures,
    "trace-gpu": StepFigures,
    "trace-gloo-straggler": StepFigures,
    "watch-cpu-bound": StepFigures,
}


def _stage(name: str) -> StageResult:
    report = Report.from_dict(json.loads((GOLDEN / f"{name}.json").read_text()))
    (stage,) = report.stages
    return stage


def _json(metrics: tuple[Metric, ...] | list[Metric]) -> str:
    return json.dumps([m.to_dict() for m in metrics])


@pytest.mark.parametrize("name", sorted(STORED))
def test_a_stored_reports_figures_are_written_again_byte_for_byte(name):
    stage = _stage(name)
    record = stage.records(STORED[name])
    written = record.to_metrics()
    assert written and _json(written) == _json(list(stage.metrics))


def test_a_trace_reads_as_its_headline_its_phases_and_each_rank():
    figures = _stage("trace-gloo-straggler").records(StepFigures)
    assert figures.ranks() == ("rank 0", "rank 1")
    assert figures.headline().value_of(Step.STEPS) == figures.value_of(Step.STEPS)
    assert set(figures.per_rank(Step.WORK_MS)) == {"rank 0", "rank 1"}
    gpu = _stage("trace-gpu").records(StepFigures)
    assert [f.phase for f in gpu.phases()] == list(Phase)
    assert gpu.figure(Step.HTA_IDLE_OTHER_RATIO) == Figure.missing("no kernels")


def test_profiles_loop_reads_as_a_scenario_per_layout_and_count():
    figures = _stage("profile-quick").records(ProfileFigures)
    assert [(s.layout, s.workers) for s in figures.scenarios] == [
        (Layout.SMALL_FILES, 0),
        (Layout.MDS, 0),
        (Layout.TEXT, 0),
    ]
    assert set(figures.shares()) == {(s.layout, 0) for s in figures.scenarios}


def test_what_a_record_cannot_read_is_left_out_never_raised():
    odd = [
        Metric.single("x", 1.0, "ms", {"quantity": "no_such_quantity"}),
        Metric.single("y", 1.0, "ms", {"quantity": "phase_ms", "phase": "no_such_phase"}),
        Metric("z", "text", "ms", labels={"quantity": "step_ms"}),  # type: ignore[arg-type]
        Metric.single("w", 1.0, "ms", {"quantity": "step_ms", "layout": "tape", "workers": 0}),
    ]
    assert StepFigures.from_metrics(odd) == StepFigures()
    assert ProfileFigures.from_metrics(odd) == ProfileFigures()


def test_a_record_made_by_hand_writes_the_names_the_stage_wrote():
    step = StepFigure(Step.STEP_MS, Figure.repeated([1.0, 2.0]), "ms", rank="rank 3")
    phase = StepFigure(Step.PHASE_MS, Figure.single(2.0), "ms", Phase.FORWARD)
    assert [m.name for m in StepFigures((step, phase)).to_metrics()] == [
        "step_ms.rank_3",
        "phase_ms.forward",
    ]
    loop = Scenario(Layout.MDS, 2, ((Phase.FORWARD, Figure.single(1.0)),), Figure.single(3.0))
    assert [m.name for m in ProfileFigures((loop,)).to_metrics()] == [
        "phase_ms.forward.mds.w2",
        "step_ms.mds.w2",
    ]


# --- the wait by stage (core/schema/loading.py) ---


def _split(persistent: bool) -> StageSplit:
    split = StageSplit(persistent=persistent, pass_starts=[0, 3])
    for step in range(6):
        if step != 2:  # a step whose batch carried no record
            exposed = [0.001 * (i + step % 3) for i in range(len(LoadStage))]
            split.put(step, exposed, [0.002 * (i + 1) for i in range(len(LoadStage))], 0.004)
    split.startups = [Startup(0.5, 0.3, 0.2, None, 2), Startup(0.4, 0.3, None, None, 2)]
    return split


@pytest.mark.parametrize("persistent", [False, True])
def test_a_loops_wait_by_stage_is_written_and_read_back_byte_for_byte(persistent):
    waits = array("d", [0.02] * 6)
    record = _split(persistent).figures(waits, 1)
    metrics = record.to_metrics()
    assert LoadFigures.from_metrics(metrics) == record
    assert _json(LoadFigures.from_metrics(metrics).to_metrics()) == _json(metrics)
    assert [s.stage for s in record.stages] == list(LoadStage)
    assert (record.restart_exposed_ms is None) == persistent
    assert record.of(LoadStage.READ).exposed_share is not None
    assert set(record.by_stage(EXPOSED_SHARE)) == set(LoadStage)


def test_another_stages_wait_by_stage_is_not_a_loops():
    # loader --factory labels its figures with their configuration; attach with more
    factory = Metric.single(
        "own.exposed_share.read", 0.5, "fraction",
        {"layout": "own", "quantity": EXPOSED_SHARE, "load_stage": "read"},
    )  # fmt: skip
    odd = Metric.single("x", 0.5, "fraction", {"quantity": EXPOSED_SHARE, "load_stage": "disk"})
    assert LoadFigures.from_metrics([factory, odd]) == LoadFigures()
    assert not LoadFigures.holds(factory)
