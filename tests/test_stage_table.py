"""The one stage table (core/stages.py): every layer finds a stage through it, so a new
stage is its own modules plus one row, and nothing else changes.

The trivial stage below (`hello`) is the diff a new stage makes: its own modules
(measuring, judging, showing, and its command, a file under cli/), its options record
and its finding's kind, each where every stage's is declared once (stages/options.py,
core/catalogue.py), and one row. Its modules stand in sys.modules under the package's
names, as its files would; its command is a file, found on cli/'s path, since a command
module registers its command as it is imported. Nothing else names it: the CLI lists and
runs it, the options and help checks (tests/test_options.py) and the catalogue's find
it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

import starvecheck.cli
from starvecheck.advice import judge
from starvecheck.advice.results import Results
from starvecheck.cli.common import app
from starvecheck.core import catalogue
from starvecheck.core import stages as stages_table
from starvecheck.core.metric import Metric
from starvecheck.core.model import Finding, Judged, Severity, StageResult, reported_as
from starvecheck.core.report import CHAIN_LINKS
from starvecheck.render.section import Section, taken
from starvecheck.render.sections import stage_sections
from starvecheck.stages import options as opts
from starvecheck.stages import registry
from starvecheck.stages.base import BaseStage, RunContext
from tests.conftest import run

SRC = Path(__file__).parent.parent / "src" / "starvecheck"

# cli/hello.py: the command, as thin as every command's.
HELLO_COMMAND = '''"""`starvecheck hello`: the trivial stage's command."""

from typing import Annotated

import typer

from starvecheck.advice.report import build_report
from starvecheck.cli.common import FailOn, FailOnOpt, JsonOpt, MarkdownOpt, Outputs, QuickOpt
from starvecheck.cli.common import app, context_of, emit, measure_one
from starvecheck.stages.options import HelloOptions


@app.command()
def hello(
    ctx: typer.Context,
    greetings: Annotated[
        int,
        typer.Option("--greetings", min=1, help="Greetings to give."),
    ] = HelloOptions.greetings,
    json_path: JsonOpt = None,
    markdown_path: MarkdownOpt = None,
    fail_on: FailOnOpt = FailOn.never,
    quick: QuickOpt = False,
) -> int:
    """Greets, and says so."""
    c = context_of(ctx)
    out = Outputs.check(json_path, markdown_path, fail_on)
    result = measure_one(HelloOptions(greetings, quick), c, out, None).result
    return emit(build_report("hello", None, [result], c), out, c)
'''


@dataclasses.dataclass(frozen=True)
class HelloOptions:
    """Its options record, as it would stand in stages/options.py."""

    greetings: int = 3
    quick: bool = False

    stage: ClassVar[str] = "hello"


# Its finding's kind, as it would stand in core/catalogue.py.
HELLO_GREETED = catalogue.Kind("hello.greeted", (Severity.OK,), "… greetings given")


class Hello(BaseStage[HelloOptions, int]):
    name = "hello"

    def plan(self, options: HelloOptions, ctx: RunContext) -> int:
        return options.greetings

    def measure(self, plan: int, ctx: RunContext) -> StageResult:
        figure = Metric.single("hello.greetings", plan, "count", {"quantity": "n"})
        return StageResult("hello", metrics=(figure,))


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: object) -> None:
    m = types.ModuleType(f"starvecheck.{name}")
    m.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, f"starvecheck.{name}", m)


@pytest.fixture
def hello_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Its own files, its record and its kind: everything but its row."""

    def rules(results: Results) -> list[Finding]:
        got = results.get("hello")
        return [Finding(catalogue.HELLO_GREETED, Severity.OK, "greeted")] if got else []

    def sections(stage: StageResult, metrics: list[Metric]) -> tuple[list[Section], list[Metric]]:
        mine = [m for m in metrics if m.name.startswith("hello.")]
        rest = [m for m in metrics if m not in mine]
        rows = [(m.name, f"{m.value:g}") for m in mine]
        return [Section(("figure", "value"), rows, metrics=taken(metrics, rest))], rest

    def complete(r: StageResult) -> StageResult:
        return replace(r, judged=Judged(verdicts={"completed": True}))

    _module(monkeypatch, "stages.hello", STAGE=Hello())
    _module(monkeypatch, "advice.hello", rules=rules, complete=complete)
    _module(monkeypatch, "render.hello", sections=sections)
    (tmp_path / "hello.py").write_text(HELLO_COMMAND)
    monkeypatch.setattr(starvecheck.cli, "__path__", [*starvecheck.cli.__path__, str(tmp_path)])
    importlib.invalidate_caches()
    monkeypatch.setattr(app, "registered_commands", list(app.registered_commands))
    monkeypatch.setattr(opts, "HelloOptions", HelloOptions, raising=False)
    monkeypatch.setattr(catalogue, "HELLO_GREETED", HELLO_GREETED, raising=False)
    monkeypatch.setitem(catalogue.CATALOGUE, "hello.greeted", HELLO_GREETED)
    yield
    sys.modules.pop("starvecheck.cli.hello", None)  # imported from tmp_path, if it was


@pytest.fixture
def hello(hello_files: None, monkeypatch: pytest.MonkeyPatch) -> StageResult:
    # The one row a new stage adds.
    row = stages_table.StageEntry(
        "hello",
        "stages.hello",
        ("advice.hello",),
        "advice.hello",
        ("render.hello",),
        command="cli.hello",
    )
    monkeypatch.setattr(stages_table, "TABLE", (*stages_table.TABLE, row))
    return Hello().measure(3, RunContext())


def test_a_new_stage_is_its_own_modules_and_one_row(hello: StageResult) -> None:
    assert registry.get("hello").name == "hello"  # measured
    judged = judge.judge(Results({"hello": hello}))  # completed, then judged
    assert [f.id for f in judged.findings] == ["hello.greeted"]
    assert judged.stages["hello"].judged.verdicts == {"completed": True}
    (section,), rest = stage_sections(hello)  # shown
    assert section.rows == [("hello.greetings", "3")] and rest == []
    assert reported_as("hello") == "hello"


def test_a_new_stage_has_its_command_from_its_row(hello: StageResult) -> None:
    assert "hello" in run("--help").stdout.split()  # listed
    r = run("hello", "--greetings", "2", "--json", "-")  # run: options, stage, advice, JSON
    assert r.exit_code == 0, r.stderr
    (stage,) = r.json["stages"]
    assert stage["stage"] == "hello" and stage["parameters"] == {}
    assert [m["value"] for m in stage["metrics"]] == [2]
    assert [f["id"] for f in stage["findings"]] == ["hello.greeted"]
    assert "Greetings to give. [default: 3;" in " ".join(run("hello", "--help").stdout.split())


def test_a_new_stage_is_in_every_check_of_its_options_and_kinds(
    hello: StageResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import test_contract, test_options

    assert test_options.records_of("hello") == [HelloOptions]
    assert HelloOptions in test_options.stage_records()
    assert test_options.mismatches()[0] == []  # its help states its record's defaults
    monkeypatch.setattr(HelloOptions, "greetings", 5)  # and the check reads it
    assert test_options.mismatches()[0] == ["hello --greetings: default 3, HelloOptions 5"]
    assert catalogue.kind("hello.greeted") is HELLO_GREETED  # a report read back
    with pytest.raises(ValueError):  # its kind's severities hold
        Finding(catalogue.HELLO_GREETED, Severity.WARNING, "t")
    # The docs check sees its id, and its command's (nothing documents them here).
    assert not test_contract.documented("hello.greeted", test_contract._docs())
    assert "cli.hello" in stages_table.commands()


def test_without_its_row_no_layer_knows_the_stage(hello_files: None) -> None:
    with pytest.raises(KeyError):
        registry.get("hello")
    result = StageResult("hello", metrics=(Metric.single("x", 1, "count"),))
    assert judge.advise_all(Results({"hello": result})) == []
    assert stage_sections(result)[0] == []
    r = run("hello")  # its file is on cli/'s path, but no row names it
    assert r.exit_code == 2 and "No such command" in r.stderr
    assert "starvecheck.cli.hello" not in sys.modules


def test_every_module_the_table_names_exists_and_keeps_its_interface() -> None:

    for e in stages_table.TABLE:
        if e.measure:
            assert stages_table.load(e.measure).STAGE.name == e.name
        for name in e.judge:
            assert callable(stages_table.load(name).rules)
        if e.complete:
            assert callable(stages_table.load(e.complete).complete)
        for name in (*e.render, *stages_table.RENDER_LAST):
            assert callable(stages_table.load(name).sections)
    for name in stages_table.commands():
        stages_table.load(name)


def test_doctor_and_the_judge_read_their_orders_off_the_table() -> None:
    from starvecheck.stages.doctor import measure

    assert measure.STAGES == ("io", "loader", "starve", "pad", "pcie")  # the chain's order
    assert stages_table.doctor_run_order() == ("pad", "starve", "io", "loader", "pcie")
    assert stages_table.reported_as() == {"factory": "loader", "trace": "profile"}


def _stage_keyed_tables(path: Path) -> list[str]:
    """Dicts keyed by two or more stage names, or tuples of tuples of them, written as
    literals outside the table: a second table by stage, which must not come back."""
    names = {e.name for e in stages_table.TABLE}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        keys: list[ast.expr] = []
        if isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Tuple) and all(isinstance(e, ast.Tuple) for e in node.elts):
            keys = [k for e in node.elts for k in e.elts]  # tiers, as AUTHORITY was
        literal = [k.value for k in keys if isinstance(k, ast.Constant)]
        # Keys that are all stage names, or two that name no chain link (`loader` and
        # `pcie` are links too: a table by link, such as advice/chain.py's fixes, is not
        # one by stage).
        staged = [v for v in literal if v in names]
        unlinked = [v for v in staged if v not in CHAIN_LINKS]
        if len(staged) >= 2 and (len(staged) == len(literal) or len(unlinked) >= 2):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_no_stage_name_keys_a_table_but_the_one():
    offenders = [
        hit
        for p in sorted(SRC.rglob("*.py"))
        if p != SRC / "core" / "stages.py"
        for hit in _stage_keyed_tables(p)
    ]
    assert offenders == []


def test_a_stage_is_timed_in_one_place_for_its_command_and_for_doctor():
    """stages/base.timed sets every result's duration_s (its measuring's wall time);
    no stage times itself (there were twelve copies)."""
    from starvecheck.stages.base import BaseStage, RunContext, timed

    class Slow(BaseStage[None, None]):
        name = "slow"

        def measure(self, plan: None, ctx: RunContext) -> StageResult:
            import time

            time.sleep(0.05)
            return StageResult("slow")

    got = timed(Slow(), None, RunContext()).result
    assert got.duration_s is not None and got.duration_s >= 0.05
    setters = [
        f"{p.relative_to(SRC)}:{n.lineno}"
        for p in sorted((SRC / "stages").rglob("*.py"))
        if p.name != "base.py" and p.parent.name != "doctor"
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.keyword) and n.arg == "duration_s"
    ]
    assert setters == []
