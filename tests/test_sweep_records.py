"""loader's, io's and starve's figures as records (core/schema/loader.py, io.py,
starve.py): the JSON's metrics are their
serialisation, so a stored report's metrics read and written again are the same
metrics, byte for byte, and a record written and read back is the same record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starvecheck.core.metric import Metric
from starvecheck.core.report import Report
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.io import IoFigures, Pattern, Place, Quantity, Reads
from starvecheck.core.schema.loader import (
    FirstBatch,
    LoaderFigures,
    Point,
    Recommended,
    Unmeasured,
)
from starvecheck.core.schema.samples import Cache, Layout, Residency
from starvecheck.core.schema.starve import Point as StarvePoint
from starvecheck.core.schema.starve import Quantity as StarveQuantity
from starvecheck.core.schema.starve import StarveFigures, mean_of

GOLDEN = Path(__file__).parent / "golden"
# Each stored report holding a stage migrated here, and the record that reads it.
STORED = {
    "loader": (LoaderFigures, ("loader-quick", "doctor-quick", "doctor-nodes")),
    "io": (IoFigures, ("io-ext4", "doctor-quick")),
    "starve": (StarveFigures, ("starve-quick", "doctor-quick")),
}


def _dumped(metrics: tuple[Metric, ...] | list[Metric]) -> str:
    return json.dumps([m.to_dict() for m in metrics])


@pytest.mark.parametrize(
    ("stage", "name"), [(s, n) for s, (_, names) in STORED.items() for n in names]
)
def test_a_stored_reports_figures_read_and_written_again_are_the_same_bytes(stage, name):
    kind = STORED[stage][0]
    report = Report.from_dict(json.loads((GOLDEN / f"{name}.json").read_text()))
    (result,) = [r for r in report.stages if r.stage == stage]
    assert result.metrics
    assert _dumped(kind.from_metrics(result.metrics).to_metrics()) == _dumped(result.metrics)


def test_a_loader_record_reads_back_as_written():
    gone = Figure.missing("not cold")
    made = LoaderFigures(
        (Residency.of(Layout.SHARD, [0.0, 0.01]),),
        (
            Point(Layout.SHARD, Cache.COLD, 0, gone, gone, gone, gone),
            Point(
                Layout.SHARD,
                Cache.WARM,
                2,
                Figure.repeated([1.0, 3.0]),
                None,
                Figure.single(0.5),
                Figure.missing("one batch"),
            ),
        ),
        (FirstBatch(Layout.SHARD, 0, Figure.repeated([0.1])),),
        (Unmeasured(Layout.MDS, "no streaming"),),
    )
    assert LoaderFigures.from_metrics(made.to_metrics()) == made
    assert made.curve(Layout.SHARD) == (Cache.WARM, {2: 2.0})
    assert made.rounds(Layout.SHARD, Cache.WARM) == {2: (1.0, 3.0)}
    recommended = Recommended({Layout.SHARD: 2}, 2)
    assert Recommended.from_metrics(recommended.to_metrics()) == recommended


def test_what_a_loader_record_cannot_read_it_leaves_out():
    odd = [
        Metric.single("x", 1.0, "samples/s", {"quantity": "samples_per_s", "layout": "tape"}),
        Metric.single(
            "y",
            1.0,
            "samples/s",
            {"quantity": "samples_per_s", "layout": "shard", "cache": "tepid", "workers": 1},
        ),
        Metric(
            "z",
            "fast",
            "s",
            labels={
                "quantity": "first_batch_s",
                "layout": "shard",  # type: ignore[arg-type]
                "workers": 1,
            },
        ),
    ]
    assert LoaderFigures.from_metrics(odd) == LoaderFigures()


def test_an_io_record_reads_back_as_written():
    place = Place(Layout.FILES, Pattern.RANDOM, Cache.COLD, 4)
    made = IoFigures(
        (Residency.of(Layout.FILES, [0.02]),),
        (
            Reads(place, Figure.repeated([1.0, 2.0]), None, Figure.single(0.1)),
            Reads(Place(Layout.SHARD, Pattern.SEQUENTIAL, Cache.WARM), Figure.missing("gone")),
        ),
    )
    assert IoFigures.from_metrics(made.to_metrics()) == made
    assert [m.name for m in made.to_metrics()][1:] == [
        "files.random.cold.t4",
        "files.random.cold.t4.p50_ms",
        "shard.sequential.warm",
    ]
    reads = made.at(place)
    assert reads is not None and reads.figure(Quantity.P50_MS) == Figure.single(0.1)


def test_a_starve_record_reads_back_as_written():
    made = StarveFigures(
        Figure.single(1.0),
        (
            StarvePoint(0, wait_ms=mean_of([1.0, 2.0, 6.0]), idle_share=Figure.single(0.5)),
            StarvePoint(2, idle_share=Figure.single(0.1), first_batch_s=Figure.missing("x")),
        ),
    )
    assert StarveFigures.from_metrics(made.to_metrics()) == made
    assert made.idle() == {0: 0.5, 2: 0.1}
    assert made.value(StarveQuantity.WAIT_MS, 0) == 3.0  # the mean, not the median
    assert made.value(StarveQuantity.WAIT_MS, 2) is None
