"""pcie's figures as records (core/schema/pcie.py): the JSON's metrics are their
serialisation, so a record written and read back is the same record, and a stored
report's metrics read and written again are the same metrics, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from starvecheck.core.metric import Metric
from starvecheck.core.report import Report
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.pcie import (
    LINK_UNITS,
    Copy,
    Direction,
    Link,
    Memory,
    Mode,
    Numa,
    Overlap,
    PcieFigures,
    Row,
    Source,
)
from starvecheck.core.schema.pcie_schema1 import schema1_labels
from starvecheck.core.schema.pcie_verdicts import OVERLAP_ROWS, PcieVerdicts

GOLDEN = Path(__file__).parent / "golden"
STORED = ("pcie-full", "pcie-no-nvml", "pcie-no-gpu")

numbers = st.floats(allow_nan=False, allow_infinity=False, width=32)
figures = st.one_of(
    st.builds(Figure.single, numbers),
    st.builds(Figure.repeated, st.lists(numbers, min_size=1, max_size=4)),
    st.builds(Figure.missing, st.text(max_size=12)),
)
maybe = st.none() | figures
copies = st.builds(
    Copy,
    st.sampled_from(Direction),
    st.sampled_from(Memory),
    st.integers(1, 1 << 34),
    figures,  # the stage always writes the wall clock's figure
    maybe,
    st.sampled_from(Source),
    st.booleans(),
)
overlaps = st.dictionaries(
    st.sampled_from(OVERLAP_ROWS),
    st.tuples(figures, maybe, maybe, maybe),
    max_size=4,
).map(lambda d: tuple(Overlap(m, mode, *fs) for (m, mode), fs in d.items()))
links = st.fixed_dictionaries({}, optional=dict.fromkeys(LINK_UNITS, figures)).map(
    lambda d: Link(**d)
)
numas = st.builds(Numa, maybe, maybe, maybe)
records = st.builds(
    PcieFigures,
    st.lists(copies, max_size=6).map(tuple),
    maybe,
    overlaps,
    links,
    numas,
    st.booleans(),
)


def _json(metrics) -> list[str]:
    return [json.dumps(m.to_dict()) for m in metrics]


@given(records)
def test_a_record_written_as_metrics_reads_back_the_same(record):
    metrics = record.to_metrics()
    assert PcieFigures.from_metrics(metrics) == record
    again = [Metric.from_dict(json.loads(x)) for x in _json(metrics)]
    assert PcieFigures.from_metrics(again) == record


def _stored(name: str) -> tuple[Metric, ...]:
    path = GOLDEN / name
    return Report.from_dict(json.loads(path.read_text())).stages[0].metrics


def test_the_stored_reports_metrics_read_and_written_again_are_the_same():
    for name in (*(f"{n}.json" for n in STORED), "labels/pcie.json"):
        metrics = _stored(name)
        assert _json(PcieFigures.from_metrics(metrics).to_metrics()) == _json(metrics), name


def test_the_full_report_reads_as_typed_figures():
    f = PcieFigures.from_metrics(_stored("pcie-full.json"))
    pinned = f.copy(Direction.H2D, Memory.PINNED, 4 << 20)
    assert pinned is not None and pinned.wall is not None and pinned.wall.values
    assert pinned.events is not None and pinned.source is Source.TORCH
    assert f.copy(Direction.D2H, Memory.PAGEABLE, 4 << 20, fresh=True).events is None
    assert f.sizes(Direction.H2D, Memory.PINNED) == [1 << 20, 4 << 20]  # 16 MiB skipped
    assert [c.source for c in f.copies].count(Source.CUDART) == 1
    assert f.overlap(Memory.PINNED, Mode.NON_BLOCKING).both_ms.values
    assert f.link.row(Row.UNDER_LOAD)[0].value == 4 and f.link.efficiency.value
    assert f.numa.remote_penalty.value is not None and not f.ratio_last
    no_gpu = PcieFigures.from_metrics(_stored("pcie-no-gpu.json"))
    assert no_gpu.ratio_last and no_gpu.reference_ratio.reason.startswith("not measured")
    assert no_gpu.link.gen_idle is None and no_gpu.overlap(Memory.PINNED, Mode.BLOCKING).ratio


def test_a_figure_a_stored_report_cannot_hold_is_left_out_never_raised_on():
    good = Metric.single("h2d.pinned.1MiB", 1.0, "GB/s", schema1_labels("h2d.pinned.1MiB"))
    odd = [
        Metric("x", "fast", "GB/s", labels=dict(good.labels)),  # a value no number
        good.labelled(direction="sideways"),
        good.labelled(size="1MiB"),
        good.labelled(variant="stale"),
        Metric.single("overlap.x", 0.5, "fraction", {"quantity": "overlap", "mode": "odd"}),
        Metric.single("link.colour", 1, "", {"quantity": "colour", "group": "link"}),
        Metric.single("numa.x", 1, "", {"quantity": "gbps", "group": "numa", "node": "far"}),
        Metric.single("loader", 1, "", {"quantity": "samples_per_s"}),
    ]
    f = PcieFigures.from_metrics([*odd, good])
    assert f == PcieFigures(copies=(Copy(Direction.H2D, Memory.PINNED, 1 << 20, Figure(1.0)),))
    assert [PcieFigures.holds(m) for m in odd] == [False] * len(odd)


def test_schema1_names_get_the_labels_the_stage_writes():
    assert schema1_labels("reference.h2d.pinned.256MiB.events") == {
        "quantity": "gbps", "direction": "h2d", "memory": "pinned", "size": 256 << 20,
        "clock": "events", "source": "cudart",
    }  # fmt: skip
    assert list(schema1_labels("d2h.pageable.1MiB.fresh"))[-1] == "variant"
    assert schema1_labels("overlap.pinned.blocking.both_ms") == {
        "quantity": "overlap_both_ms", "memory": "pinned", "mode": "blocking",
    }  # fmt: skip
    assert schema1_labels("numa.h2d.pinned.remote")["node"] == "remote"
    assert schema1_labels("link.gen_max") == {"quantity": "gen_max", "group": "link"}
    assert schema1_labels("duration_note") == {"quantity": "duration_note"}
    assert schema1_labels("link.colour") == {"quantity": "link.colour"}


@given(
    st.dictionaries(st.sampled_from(OVERLAP_ROWS), st.sampled_from(("PARALLEL", "UNKNOWN"))),
    st.dictionaries(st.sampled_from(Row), st.none() | numbers),
)
def test_verdicts_written_and_read_back(overlap, peaks):
    verdicts = PcieVerdicts(overlap, peaks)
    written = json.loads(json.dumps(verdicts.to_verdicts()))
    read = PcieVerdicts.from_verdicts(written)
    assert read.overlaps == overlap
    assert read.peaks == {r: p for r, p in peaks.items() if p is not None}


def test_the_stored_verdicts_read_as_the_record():
    report = Report.from_dict(json.loads((GOLDEN / "pcie-full.json").read_text()))
    stored = report.stages[0].judged.verdicts
    v = PcieVerdicts.from_verdicts(stored)
    assert v.verdict(Memory.PAGEABLE, Mode.BLOCKING) == "SEQUENTIAL"
    assert v.peak(Row.UNDER_LOAD) == 31.5
    assert v.to_verdicts() == stored


def test_a_result_carries_its_figures_as_a_record_read_once():
    import pickle
    from dataclasses import replace

    from starvecheck.core.model import Judged

    result = Report.from_dict(json.loads((GOLDEN / "pcie-full.json").read_text())).stages[0]
    figures = result.records(PcieFigures)
    assert result.records(PcieFigures) is figures == PcieFigures.from_metrics(result.metrics)
    assert replace(result, metrics=()).records(PcieFigures) == PcieFigures()  # read again
    assert replace(result) == result and "_records" not in repr(result)
    assert pickle.loads(pickle.dumps(result)).records(PcieFigures) == figures
    verdicts = result.judged.read(PcieVerdicts)
    assert result.judged.read(PcieVerdicts) is verdicts
    judged = Judged.of(verdicts)
    assert judged.read(PcieVerdicts) is verdicts and judged.verdicts == verdicts.to_verdicts()
    assert Judged().read(PcieVerdicts) == PcieVerdicts()
