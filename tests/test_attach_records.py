"""attach's figures as records (core/schema/attachfigures.py): the JSON's metrics are
their serialisation, so a stored report's metrics read and written again are the same
metrics, byte for byte, a record written and read back is the same record, and what
the record cannot read is left out, never raised on."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from starvecheck.core.metric import Metric
from starvecheck.core.report import Report
from starvecheck.core.schema.attach import Interval, Loading, Main, Share, WaitPart
from starvecheck.core.schema.attachfigures import (
    AttachFigures,
    GpuUse,
    Machine,
    RankFigures,
    Sampler,
)
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.loading import LoadStage

GOLDEN = Path(__file__).parent / "golden"
STORED = ("attach-one-rank", "attach-ranks")


def _metrics(name: str) -> tuple[Metric, ...]:
    report = Report.from_dict(json.loads((GOLDEN / f"{name}.json").read_text()))
    (stage,) = [s for s in report.stages if s.stage == "attach"]
    return stage.metrics


def test_every_stored_report_is_written_again_byte_for_byte():
    for name in STORED:
        metrics = _metrics(name)
        again = AttachFigures.from_metrics(metrics).to_metrics()
        assert json.dumps([m.to_dict() for m in again]) == json.dumps(
            [m.to_dict() for m in metrics]
        ), name


def test_the_stored_figures_are_read_by_attribute():
    figures = AttachFigures.from_metrics(_metrics("attach-ranks"))
    assert [(r.pid, r.rank) for r in figures.ranks] == [(5101, 0), (5111, 1), (5121, 2)]
    rank = figures.rank(5111)
    data = next(s for s in rank.main if s.kind is Main.DATA)
    assert (data.value, data.interval.low, data.interval.high) == (0.495, 0.4457, 0.5444)
    assert [p.stage for p in rank.wait] == [
        LoadStage.COLLATE, LoadStage.HANDOVER, LoadStage.READ, LoadStage.TRANSFORM
    ]  # fmt: skip
    assert rank.wait[0].from_workers is True and rank.wait[1].from_workers is False
    assert rank.workers_found is not None and rank.workers_found.value == 2
    assert figures.machine.nr_periods is not None and figures.machine.nr_periods.value == 200
    assert figures.machine.others_cpus_each_s is not None
    assert figures.machine.others_cpus_each_s.n == 4 and figures.machine_first
    assert figures.rank(1).main == ()  # a PID the run has none of


def _one(v: float) -> Figure:
    return Figure.single(v)


def _rank(pid: int, rank: int | None, sampled: bool, block: bool) -> RankFigures:
    ci = Interval(0.1, 0.3, 400, 380.5, 40, 0.01)
    return RankFigures(
        pid,
        rank,
        samples=_one(400.0) if block else None,
        main=(Share(Main.DATA, _one(0.2), ci), Share(Main.STEP, _one(0.8), ci)) if block else (),
        loading=(Share(Loading.IDLE, _one(0.2), ci),) if block else (),
        workers=(Share(Loading.READ, _one(0.5), ci),) if block else (),
        wait=(WaitPart(LoadStage.READ, _one(0.9), Interval(0.8, 0.95, 80, 80.0, 9), True),)
        if block
        else (),
        main_cpus=_one(0.9) if block else None,
        main_cpus_each_s=Figure.repeated([0.8, 1.0]) if block else None,
        not_taken=_one(0.0) if sampled else None,
        workers_not_sampled=_one(1.0) if sampled else None,
    )


def test_a_record_as_the_stage_fills_it_is_read_back_as_it_was():
    made = AttachFigures(
        ranks=(_rank(10, 0, True, True), _rank(20, 1, False, True), _rank(30, 2, True, False)),
        machine=Machine(others_cpus=_one(0.3), others_cpus_each_s=Figure.repeated([0.2, 0.4])),
        gpus=(GpuUse(0, Figure.repeated([40.0, 60.0])), GpuUse(3, Figure.repeated([1.0]))),
        sampler=Sampler(rate=_one(100.0), cpus=_one(0.05)),
    )
    metrics = made.to_metrics()
    assert AttachFigures.from_metrics(metrics) == made
    names = [m.name for m in metrics]
    # the ranks' own figures, then the machine's, the GPUs', the sampling's, each rank's
    assert names.index("attach.main.samples") < names.index("attach.machine.others_cpus")
    assert names.index("attach.gpu.utilization") < names.index("attach.sampler.rate")
    assert names[-1] == "attach.workers.not_sampled"
    # a rank with nothing but its sampling's figures keeps its place among the ranks
    assert [r.pid for r in AttachFigures.from_metrics(metrics).ranks] == [10, 20, 30]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 99), st.one_of(st.none(), st.integers(0, 7)), st.booleans()),
        max_size=4,
        unique_by=lambda t: t[0],
    ),
    st.booleans(),
)
def test_property_ranks_and_the_machines_place_are_written_again(ranks, machine_first):
    made = AttachFigures(
        ranks=tuple(_rank(pid, rank, sampled, True) for pid, rank, sampled in ranks),
        machine=Machine(load_average=_one(1.5)),
        machine_first=machine_first and bool(ranks),
    )
    assert AttachFigures.from_metrics(made.to_metrics()) == made


def test_what_the_record_cannot_read_is_left_out_never_raised():
    odd = [
        Metric.single("x", 0.5, "share", {"quantity": "main_share", "kind": "nonesuch", "pid": 1}),
        Metric.single("x", 0.5, "share", {"quantity": "main_share", "kind": "data", "pid": "1"}),
        Metric.single(
            "x",
            0.5,
            "share",
            {"quantity": "exposed_share", "load_stage": "read", "pid": 1, "from_workers": "yes"},
        ),
        Metric.single("x", 1.0, "%", {"quantity": "gpu_utilization", "gpu": "0"}),
        Metric.single("x", 1.0, "CPUs", {"quantity": "main_cpus", "rank": "0", "pid": 1}),
        Metric("x", "text", "CPUs", labels={"quantity": "others_cpus"}),  # type: ignore[arg-type]
        Metric.single("io", 1.0, "MB/s", {"quantity": "mb_per_s"}),
    ]
    assert AttachFigures.from_metrics(odd) == AttachFigures()
    assert not any(AttachFigures.is_share(m) for m in odd)
    # a share from before intervals were kept: read, its interval empty
    bare = Metric.single("x", 0.4, "share", {"quantity": "main_share", "kind": "data", "pid": 1})
    (rank,) = AttachFigures.from_metrics([bare]).ranks
    assert rank.main == (Share(Main.DATA, _one(0.4)),) and AttachFigures.is_share(bare)
