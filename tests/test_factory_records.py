"""loader --factory's figures as records (core/schema/factory.py): a stored report's
metrics read and written again are the same metrics, byte for byte; each configuration
reads with its role (an enum), its settings and its figures; judging's ratios read back
from the report's figures; judging's choice is typed (core/schema/factory_choice.py)."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

from starvecheck.core.judged import Judged
from starvecheck.core.metric import Metric
from starvecheck.core.report import Report
from starvecheck.core.schema.factory import FactoryFigures, Role, Settings
from starvecheck.core.schema.factory_choice import Choice
from starvecheck.core.schema.loading import LoadStage

GOLDEN = Path(__file__).parent / "golden"
STORED = ("loader-factory.json", "loader-factory-undecided.json")


def _json(metrics) -> list[str]:
    return [json.dumps(m.to_dict()) for m in metrics]


def _stored(name: str):
    return Report.from_dict(json.loads((GOLDEN / name).read_text())).stages[0]


def test_the_stored_reports_metrics_read_and_written_again_are_the_same():
    for name in STORED:
        metrics = _stored(name).metrics
        assert metrics, name
        assert _json(FactoryFigures.from_metrics(metrics).to_metrics()) == _json(metrics), name


def test_the_stored_report_reads_as_typed_figures():
    stage = _stored("loader-factory.json")
    f = stage.records(FactoryFigures)
    roles = [c.role for c in f.configurations]
    assert roles[0] is Role.CURRENT and Role.START in roles and Role.BASE in roles
    current = f.configurations[0]
    assert current.current and current.settings == Settings(3, 3, False, False)
    assert current.samples_per_s is not None and current.samples_per_s.n == 5
    assert current.share(LoadStage.READ) is not None
    start = next(c for c in f.configurations if c.role is Role.START)
    assert start.settings.start_method is not None
    rate = current.rate_metric()
    assert rate is not None and rate.name == "own.w3.current.samples_per_s"


def test_judgings_ratios_read_back_from_the_reports_figures():
    stage = _stored("loader-factory.json")
    assert all(c.vs_current is None for c in stage.records(FactoryFigures).configurations)
    f = FactoryFigures.from_metrics(stage.figures)
    assert any(c.vs_current is not None and c.vs_current.ratio for c in f.rated())


def test_a_figure_a_stored_report_cannot_hold_is_left_out_never_raised_on():
    labels = {"layout": "own", "role": "workers", "workers": 2, "prefetch_factor": 2}
    odd = [
        Metric.single("a", 1, "", {**labels, "quantity": "no_such"}),
        Metric.single("b", 1, "", {**labels, "role": "no_such", "quantity": "samples_per_s"}),
        Metric.single("c", 1, "", {**labels, "workers": "two", "quantity": "samples_per_s"}),
        Metric.single("d", 1, "", {"quantity": "samples_per_s"}),
    ]
    assert FactoryFigures.from_metrics(odd).to_metrics() == ()


def test_judgings_choice_is_typed():
    hints = typing.get_type_hints(Judged)
    assert hints["choice"] == Choice | None
    assert all(f.type != "object" for f in dataclasses.fields(Judged))
