"""The result model: statistics, ranking, verdicts, and JSON round trips."""

from __future__ import annotations

import json

import pytest

from starvecheck.advice import rank, verdict
from starvecheck.core.metric import Metric
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult, at_or_above
from starvecheck.core.report import SCHEMA_VERSION, Report


def test_repeated_metric_statistics():
    m = Metric.repeated("shard.sequential.cold", [100.0, 120.0, 110.0, 90.0], "MB/s")
    assert m.value == m.median == 105.0
    assert (m.min, m.max, m.n) == (90.0, 120.0, 4)
    assert m.stdev == pytest.approx(12.9099, rel=1e-4)


def test_single_run_has_zero_spread_and_no_runs_is_missing():
    assert Metric.repeated("x", [5.0], "s").stdev == 0.0
    missing = Metric.repeated("x", [], "s")
    assert missing.value is None and missing.reason == "no runs completed"


def _f(id_, severity, gain=None):
    return Finding(id_, severity, id_, gain=gain, stage="t")


def test_rank_orders_by_gain_then_severity_and_drops_ok():
    findings = [
        _f("a.info", Severity.INFO),
        _f("b.warn-big", Severity.WARNING, Gain(GainKind.THROUGHPUT, 3.0)),  # saves 67%
        _f("c.crit", Severity.CRITICAL),
        _f("d.blocker", Severity.WARNING, Gain(GainKind.BLOCKER)),
        _f("e.share", Severity.CRITICAL, Gain(GainKind.STEP_SHARE, 0.2)),
        _f("f.ok", Severity.OK),
    ]
    assert [f.id for f in rank(findings)] == [
        "d.blocker",
        "b.warn-big",
        "e.share",
        "c.crit",
        "a.info",
    ]


def test_a_gain_not_estimated_ranks_with_no_gain_so_severity_decides():
    findings = [
        _f("a.info-unestimated", Severity.INFO, Gain(GainKind.THROUGHPUT, None, "depends")),
        _f("b.info-none", Severity.INFO, Gain(GainKind.THROUGHPUT, 1.0)),
        _f("c.warn", Severity.WARNING),
        _f("d.info-small", Severity.INFO, Gain(GainKind.STEP_SHARE, 0.05)),
    ]
    assert [f.id for f in rank(findings)] == [
        "d.info-small",
        "c.warn",
        "a.info-unestimated",
        "b.info-none",
    ]


def test_rank_deduplicates_keeping_the_larger_gain():
    small = _f("io.small-files", Severity.WARNING, Gain(GainKind.THROUGHPUT, 1.5))
    big = _f("io.small-files", Severity.WARNING, Gain(GainKind.THROUGHPUT, 20.0))
    assert rank([small, big]) == (big,)


def test_gain_scores():
    assert Gain(GainKind.THROUGHPUT, 2.0).score == pytest.approx(0.5)
    assert Gain(GainKind.STEP_SHARE, 0.76).score == 0.76
    assert Gain(GainKind.BLOCKER).score == float("inf")
    assert "1.40x" in Gain(GainKind.THROUGHPUT, 1.4, "measured").describe()


def test_verdict_names_the_first_item():
    checklist = rank([_f("x.warn", Severity.WARNING), _f("y.crit", Severity.CRITICAL)])
    assert verdict(checklist, 5) == "1 critical, 1 warning: start with y.crit (y.crit)."
    assert verdict((), 4) == "All 4 checks passed."
    assert "nothing to fix" in verdict(rank([_f("z", Severity.INFO)]), 1)


def test_at_or_above():
    fs = [_f("a", Severity.INFO), _f("b", Severity.WARNING), _f("c", Severity.CRITICAL)]
    assert [f.id for f in at_or_above(fs, Severity.WARNING)] == ["b", "c"]


def test_report_round_trips_through_json():
    stage = StageResult(
        stage="io",
        parameters={"samples": 100},
        metrics=(
            Metric.repeated("small_files.random.cold", [70.0, 72.0, 69.0], "MB/s"),
            Metric.missing("shard.random.cold", "MB/s", "cache could not be evicted"),
        ),
        findings=(_f("io.small-files", Severity.WARNING, Gain(GainKind.THROUGHPUT, 20.0)),),
        caveats=("cold figures are warm",),
        capacity=Metric.single("capacity", 1234.0, "samples/s"),
        duration_s=1.5,
    )
    report = Report(
        "io",
        {"cpu": {"logical": 2}},
        (stage,),
        rank(stage.findings),
        None,
        "v",
        "0.1.0",
        "2026-11-21T00:00:00+00:00",
    )
    d = json.loads(json.dumps(report.to_dict()))
    assert d["schema_version"] == SCHEMA_VERSION
    assert Report.from_dict(d) == report


def test_report_from_unknown_schema_is_refused():
    with pytest.raises(ValueError, match="schema_version"):
        Report.from_dict({"schema_version": 99, "command": "env"})
