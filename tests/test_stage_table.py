"""The one stage table (core/stages.py): every layer finds a stage through it, so a new
stage is its own modules plus one row, and nothing else changes.

The trivial stage below (`hello`) is the diff a new stage makes: three modules of its
own (measuring, judging, showing) and one row. Its modules stand in sys.modules under
the package's names, as its files would.
"""

from __future__ import annotations

import ast
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

from starvecheck.advice import judge
from starvecheck.advice.results import Results
from starvecheck.core import stages as stages_table
from starvecheck.core.metric import Metric
from starvecheck.core.model import CHAIN_LINKS, Finding, Judged, Severity, StageResult, reported_as
from starvecheck.render.section import Section, taken
from starvecheck.render.sections import stage_sections
from starvecheck.stages import registry

SRC = Path(__file__).parent.parent / "src" / "starvecheck"


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: object) -> None:
    m = types.ModuleType(f"starvecheck.{name}")
    m.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, f"starvecheck.{name}", m)


@pytest.fixture
def hello(monkeypatch: pytest.MonkeyPatch) -> StageResult:
    result = StageResult(
        "hello", metrics=(Metric.single("hello.greetings", 3, "count", {"quantity": "n"}),)
    )

    def rules(results: Results) -> list[Finding]:
        got = results.get("hello")
        return [Finding("hello.greeted", Severity.OK, "greeted")] if got else []

    def sections(stage: StageResult, metrics: list[Metric]) -> tuple[list[Section], list[Metric]]:
        mine = [m for m in metrics if m.name.startswith("hello.")]
        rest = [m for m in metrics if m not in mine]
        rows = [(m.name, f"{m.value:g}") for m in mine]
        return [Section(("figure", "value"), rows, metrics=taken(metrics, rest))], rest

    def complete(r: StageResult) -> StageResult:
        return replace(r, judged=Judged(verdicts={"completed": True}))

    _module(monkeypatch, "stages.hello", STAGE=types.SimpleNamespace(name="hello"))
    _module(monkeypatch, "advice.hello", rules=rules, complete=complete)
    _module(monkeypatch, "render.hello", sections=sections)
    # The one row a new stage adds.
    row = stages_table.StageEntry(
        "hello", "stages.hello", ("advice.hello",), "advice.hello", ("render.hello",)
    )
    monkeypatch.setattr(stages_table, "TABLE", (*stages_table.TABLE, row))
    return result


def test_a_new_stage_is_its_own_modules_and_one_row(hello: StageResult) -> None:
    assert registry.get("hello").name == "hello"  # measured
    judged = judge.judge(Results({"hello": hello}))  # completed, then judged
    assert [f.id for f in judged.findings] == ["hello.greeted"]
    assert judged.stages["hello"].judged.verdicts == {"completed": True}
    (section,), rest = stage_sections(hello)  # shown
    assert section.rows == [("hello.greetings", "3")] and rest == []
    assert reported_as("hello") == "hello"


def test_without_its_row_no_layer_knows_the_stage() -> None:
    with pytest.raises(KeyError):
        registry.get("hello")
    result = StageResult("hello", metrics=(Metric.single("x", 1, "count"),))
    assert judge.advise_all(Results({"hello": result})) == []
    assert stage_sections(result)[0] == []


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
