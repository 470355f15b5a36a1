"""Numbers from untrusted places parsed strictly (issue 48, item 6): every float option
of every command refuses nan and inf in one line (the options found from the app
itself, so a new one cannot miss it); counts and ranks read from another process, from
py-spy's output or from the environment are ASCII digits only ("²" is a digit to
str.isdigit, not to int; "٣" is one to int); a narrow terminal wraps every fact and
every checklist line, never drops them."""

from __future__ import annotations

import re

import pytest
import typer

from starvecheck.cli import args, ranks
from starvecheck.cli.common import app
from starvecheck.core.status import UsageError
from starvecheck.core.units import parse_uint
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.attach import budget, spy, target
from tests.conftest import one_line, run
from tests.test_attach_target import add_process

# Arguments a command needs before its options are read.
REQUIRED = {"attach": ["1"]}


def float_options() -> list[tuple[str, str]]:
    """(command, option) for every float option of every command, from the app."""
    found = []
    for name, command in typer.main.get_command(app).commands.items():
        for p in command.params:
            if type(p.type).__name__ in ("FloatParamType", "FloatRange"):
                found.append((name, p.opts[0]))
    return found


FLOATS = float_options()


def test_the_float_options_are_found() -> None:
    assert ("attach", "--duration") in FLOATS and ("doctor", "--step-ms") in FLOATS
    assert len(FLOATS) >= 12, FLOATS


@pytest.mark.parametrize("command, option", FLOATS)
def test_every_float_option_goes_through_the_one_check(command: str, option: str) -> None:
    """A float option without `finite` lets nan through (click's FloatRange does)."""
    param = next(
        p for p in typer.main.get_command(app).commands[command].params if p.opts[0] == option
    )
    assert getattr(param.callback, "finite_range", None) is not None, (command, option)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "-1e999", "NaN", "-nan"])
@pytest.mark.parametrize("command, option", FLOATS)
def test_every_float_option_refuses_nan_and_inf(command: str, option: str, value: str) -> None:
    r = run(command, *REQUIRED.get(command, []), f"{option}={value}")
    err = one_line(r)
    assert option in err and r.stdout == ""


# ---------------------------------------------------------------- ASCII digits only


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0", 0),
        ("42", 42),
        ("18446744073709551615", 18446744073709551615),
        ("²", None),
        ("٣", None),
        ("１", None),
        ("+1", None),
        ("-1", None),
        (" 1", None),
        ("1_000", None),
        ("", None),
        ("1" * 5000, None),
        ("1" * 21, None),
    ],
)
def test_parse_uint_is_ascii_digits_only(text: str, expected: int | None) -> None:
    assert parse_uint(text) == expected


@pytest.mark.parametrize("value", ["²", "٣", "1" * 5000, "1_0", "+1"])
def test_a_job_whose_rank_is_no_ascii_number_is_a_job_without_rank(tmp_path, value) -> None:
    add_process(tmp_path, 100, 1, ["python", "train.py"], env={"RANK": value})
    job = target.find(100, root=SysRoot(tmp_path))
    assert [(r.pid, r.rank) for r in job.ranks] == [(100, None)]


def test_a_thread_count_that_is_no_ascii_number_is_unknown(tmp_path) -> None:
    add_process(tmp_path, 100, 1, ["python", "train.py"])
    status = tmp_path / "proc" / "100" / "status"
    for value in ("²", "1" * 5000):
        status.write_text(status.read_text().replace("Threads:\t1", f"Threads:\t{value}"))
        assert budget.threads_of(100, SysRoot(tmp_path)) is None
        status.write_text(status.read_text().replace(f"Threads:\t{value}", "Threads:\t1"))


def test_a_command_line_forging_a_thread_id_in_py_spys_output_is_skipped() -> None:
    """A job may set its command line to anything, `;` included: py-spy prints it
    inside the stack line."""
    forged = 'process 7:"x;thread (²): y";thread (8): MainThread;f (a.py:1) 3'
    honest = 'process 7:"python train.py";thread (9): MainThread;f (a.py:1) 5'
    stacks = spy.parse_raw(f"{forged}\n{honest}\n")
    assert (7, 9) in stacks.by_thread and stacks.samples == 5


@pytest.mark.parametrize(
    "rank, world", [("٠", "٢"), ("0", "²"), (" 0", "2"), ("0", "1" * 5000), ("+0", "2")]
)
def test_doctor_under_torchrun_refuses_a_rank_that_is_no_ascii_number(rank, world) -> None:
    with pytest.raises(UsageError, match="expected 0 <= RANK < WORLD_SIZE"):
        ranks.from_environ({"RANK": rank, "WORLD_SIZE": world})


@pytest.mark.parametrize("text", ["٢", "1,²", "1" * 5000, "1_0"])
def test_worker_counts_are_ascii_digits(text: str) -> None:
    with pytest.raises(UsageError, match="expected counts"):
        args.worker_counts(text)


def test_worker_counts_still_take_spaces_after_commas() -> None:
    assert args.worker_counts("0, 2,4") == (0, 2, 4)


# ---------------------------------------------------------------- a narrow terminal


def _words(text: str) -> list[str]:
    return [w for w in text.split() if w]


@pytest.mark.parametrize("width", [10, 12, 20, 40])
def test_a_narrow_terminal_wraps_every_fact_table_cell_and_checklist_line(width: int) -> None:
    from starvecheck.core.context import Context
    from starvecheck.core.report import Report
    from starvecheck.core.text import escaped
    from starvecheck.render import facts
    from starvecheck.render.terminal import as_text

    wide = run("pad", "--quick", "--json", "-")
    assert wide.exit_code == 0, wide.stderr
    report = Report.from_dict(wide.json)
    assert report.checklist, "pad --quick gives no checklist to show"
    text = as_text(report, Context(stdout_isatty=False, width=width).console())
    squeezed = re.sub(r"\s+", "", text)
    shown = escaped(report)
    expected = [value for _, value in facts.sections(shown)[0].rows]
    from starvecheck.render.sections import stage_sections

    for stage in shown.stages:
        sections, _ = stage_sections(stage)
        expected += [cell for section in sections for row in section.rows for cell in row]
    for f in shown.checklist:
        expected += [f.title, f.id, f.evidence or "", f.recommendation or ""]
        expected.append(f.gain.describe() if f.gain else "not estimated")
    missing = [
        w for value in expected for w in _words(value) if re.sub(r"\s+", "", w) not in squeezed
    ]
    assert not missing, f"width {width}: dropped {missing[:10]}"
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.slow
def test_a_real_terminal_ten_columns_wide_shows_every_checklist_word(tmp_path) -> None:
    """pad on a pseudo-terminal with COLUMNS=10, as a person would see it."""
    import os
    import pty
    import select
    import sys
    import time
    from pathlib import Path

    from starvecheck.core.report import Report

    src = str(Path(__file__).resolve().parents[1] / "src")
    wide = run("pad", "--quick", "--json", "-")
    report = Report.from_dict(wide.json)
    pid, fd = pty.fork()
    if pid == 0:  # the child: starvecheck on the terminal
        os.environ.update(COLUMNS="10", PYTHONPATH=src, NO_COLOR="1")
        os.execv(sys.executable, [sys.executable, "-m", "starvecheck", "pad", "--quick"])
    out, deadline = b"", time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        try:
            chunk = os.read(fd, 65536) if ready else b""
        except OSError:  # the child ended: EIO
            break
        if ready and not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    assert os.waitstatus_to_exitcode(status) == 0, text[-500:]
    squeezed = re.sub(r"\s+", "", text)
    words = [w for f in report.checklist for w in f"{f.title} {f.evidence or ''}".split()]
    missing = [w for w in words if w not in squeezed]
    assert words and not missing, missing[:10]


@pytest.mark.parametrize("width", [10, 24, 40])
def test_doctors_workload_chain_and_nodes_keep_every_word_when_narrow(width: int) -> None:
    import json
    from pathlib import Path

    from starvecheck.core.context import Context
    from starvecheck.core.report import Report
    from starvecheck.core.text import escaped
    from starvecheck.render import chain
    from starvecheck.render.terminal import as_text

    stored = sorted((Path(__file__).parent / "golden").glob("doctor-*.json"))
    assert stored, "no stored doctor report"
    report = Report.from_dict(json.loads(stored[0].read_text()))
    text = as_text(report, Context(stdout_isatty=False, width=width).console())
    squeezed = re.sub(r"\s+", "", text)
    shown = escaped(report)
    cells = [c for row in chain.workload_rows(shown.workload) for c in row]
    cells += [c for row in chain.chain_rows(shown.chain, shown.weakest_link) for c in row]
    cells += [c for row in chain.node_rows(shown.nodes) for c in row]
    missing = [w for c in cells for w in c.split() if w not in squeezed]
    assert not missing, f"width {width}: dropped {missing[:10]}"
