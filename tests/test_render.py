"""Renderers against stored reports: exact output, as hyperfine's tests compare tables.

tests/golden/<name>.json are stored reports (of the fake machines, of real runs of
each command, of stage results built by hand: tests/fixtures/goldens.py says how each
was made). Each is read back through Report.from_dict and must be written again byte
for byte by the JSON export, and its terminal and Markdown renderings must be the
stored .txt and .md byte for byte; every stage of the stage table has one. After an
intended change of output, regenerate with:  UPDATE_GOLDEN=1 pytest tests/test_render.py
(the fake machines' reports are made again; a real run's, or a hand-built one's, only
where its .json was deleted).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from starvecheck.core import stages
from starvecheck.core.context import Context
from starvecheck.core.model import Finding, Severity
from starvecheck.core.report import Report
from starvecheck.core.schema.machine import Machine
from starvecheck.render import json as json_export
from starvecheck.render import markdown
from starvecheck.render.terminal import render
from tests.fixtures import goldens

GOLDEN = Path(__file__).parent / "golden"
UPDATE = bool(os.environ.get("UPDATE_GOLDEN"))
# Every stored report: each file in tests/golden, and each a maker can make (a deleted
# one is made again under UPDATE_GOLDEN=1). A golden added later is checked below with
# no code of its own.
NAMES = sorted({p.stem for p in GOLDEN.glob("*.json")} | set(goldens.MAKERS))
# A stage of the stage table that may have no golden yet (none: every stage has one).
PENDING: set[str] = set()


def stored_text(name: str, tmp_path: Path) -> str:
    """The stored report's JSON as the file holds it (made again first where
    UPDATE_GOLDEN=1 and its maker says so: tests/fixtures/goldens.py)."""
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        goldens.update(name, path, tmp_path / "made")
    return path.read_text()


def stored_report(name: str, tmp_path: Path) -> Report:
    return Report.from_dict(json.loads(stored_text(name, tmp_path)))


def terminal_text(report: Report) -> str:
    out = io.StringIO()
    console = Context(stdout=out, stdout_isatty=False, width=100, environ={}).console()
    render(report, console)
    return "\n".join(line.rstrip() for line in out.getvalue().split("\n"))


def check(path: Path, text: str) -> None:
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("name", NAMES)
def test_the_stored_report_is_written_back_byte_for_byte(name, tmp_path):
    """Read through the project's own loader (Report.from_dict) and written by the JSON
    export, a stored report is the same bytes: no field lost, no float printed anew."""
    text = stored_text(name, tmp_path)
    assert json_export.serialize(Report.from_dict(json.loads(text))) == text


def test_the_byte_check_sees_a_field_lost_and_a_float_printed_anew(tmp_path):
    text = stored_text("pad-default", tmp_path)
    data = json.loads(text)
    data["stages"][0]["a_field_no_reader_knows"] = 1
    lost = json.dumps(data, indent=2) + "\n"
    assert json_export.serialize(Report.from_dict(json.loads(lost))) != lost
    reprinted = text.replace('"duration_s": 0.05', '"duration_s": 0.050')
    assert reprinted != text
    assert json_export.serialize(Report.from_dict(json.loads(reprinted))) != reprinted


@pytest.mark.parametrize("name", NAMES)
def test_terminal_rendering(name, tmp_path):
    check(GOLDEN / f"{name}.txt", terminal_text(stored_report(name, tmp_path)))


@pytest.mark.parametrize("name", NAMES)
def test_markdown_rendering(name, tmp_path):
    check(GOLDEN / f"{name}.md", markdown.serialize(stored_report(name, tmp_path)))


def golden_stages() -> set[str]:
    """The stages the goldens report: each stage result's own name (loader --factory's
    `factory`, profile --trace's `trace`); a doctor report counts for doctor alone, as
    each stage it runs has its own command's report."""
    out = set()
    for p in GOLDEN.glob("*.json"):
        report = Report.from_dict(json.loads(p.read_text()))
        out |= {"doctor"} if report.command == "doctor" else {s.stage for s in report.stages}
    return out


def test_every_stage_of_the_stage_table_has_a_golden_report():
    table = {e.name for e in stages.TABLE}
    assert table >= PENDING  # a stage pending by a name the table has
    assert sorted(table - golden_stages() - PENDING) == []
    # One pending that has a golden now: its line above goes.
    assert sorted(PENDING & golden_stages()) == []


def _cells(line: str) -> int:
    """Columns of a Markdown table row, an escaped pipe not counting as a border."""
    return line.replace("\\|", "").count("|") - 1


def test_markdown_escapes_table_cells():
    # A finding whose text holds a pipe and a line break, as a user's path or a shell
    # snippet can: each must stay inside its cell.
    report = Report.from_dict(json.loads((GOLDEN / "k8s-pod-v2.json").read_text()))
    tricky = Finding(
        "test.pipes",
        Severity.WARNING,
        "a | b",
        evidence="cat x | wc -l\nsecond line",
        recommendation="`a || b`",
    )
    report = replace(report, checklist=(tricky, *report.checklist))
    text = markdown.serialize(report)
    tables = 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---"):  # a table: its header above, its rows below
            tables += 1
            width = _cells(lines[i - 1])
            for row in lines[i + 1 :]:
                if not row.startswith("|"):
                    break
                assert _cells(row) == width, row
    assert tables >= 2
    row = next(x for x in lines if "test.pipes" in x)
    assert "a \\| b" in row and "cat x \\| wc -l second line" in row and "a \\|\\| b" in row


def test_terminal_shows_the_gpu_table_and_the_ranked_order(tmp_path):
    text = terminal_text(stored_report("baremetal-numa-8gpu", tmp_path))
    assert "0000:ba:00.0" in text and "gen1 x8" in text and "63.0" in text
    assert "0000:ab:00.0" in text  # not an emoji: the console reads no markup
    # Warnings come before the info note in the checklist.
    assert text.index("[env.numa-remote-gpu]") < text.index("[env.pcie-gen-below-max]")


# A real `io --quick` report from the development machine (ext4 on a virtio disk).
def test_io_shows_its_storage_and_its_patterns(tmp_path):
    report = stored_report("io-ext4", tmp_path)
    text = terminal_text(report)
    # io shows the facts about its storage, not the GPU table or /dev/shm.
    assert "Storage" in text and "/dev/shm" not in text
    assert "pattern" in text and "small_files.random" in text and "p99 ms" in text
    assert "| pattern | cache | readers | MB/s |" in markdown.serialize(report)


# A `pad` report on the embedded default.
def test_pad_shows_no_machine_and_every_strategy(tmp_path):
    report = stored_report("pad-default", tmp_path)
    text = terminal_text(report)
    # Padding is about the data: no machine facts, one row per strategy, the checklist.
    assert "CPU" not in text and "GPU" not in text.split("pad\n")[0]
    rows = [line.split()[0] for line in text.splitlines() if line.split()]
    assert all(s in rows for s in ("pad_to_context", "greedy_pack", "ffd_pack", "bfd_pack"))
    assert "[pad.waste]" in text
    md = markdown.serialize(report)
    assert "### Machine" not in md and "| strategy | real | padding |" in md


@pytest.mark.parametrize("name", NAMES)
def test_the_machine_facts_are_the_record_probe_fills_written_back_whole(name, tmp_path):
    """render reads a report's machine facts as the record probe/ fills (`Report.facts`);
    every stored report's facts read as that record write the same JSON again."""
    machine = json.loads(stored_text(name, tmp_path))["machine"]
    assert Machine.from_dict(machine).to_dict() == machine or not machine


def test_a_stored_machine_record_is_read_without_raising():
    """A fact of the wrong type reads as None (or empty), never raised on."""
    odd = Machine.from_dict({"cpu": {"logical": "8", "quota_cpus": 2}, "gpus": [1, {}]})
    assert odd.cpu.logical is None and odd.cpu.quota_cpus == 2 and odd.real is True
    assert len(odd.gpus) == 1 and odd.gpus[0].pcie.gen_max is None
    assert Machine.from_dict({}).storage.path == ""
