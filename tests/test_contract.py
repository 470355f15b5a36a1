"""The contract between measuring, judging and showing (as psutil's test_contracts):

- layers: advice/ never imports stages/; render/ never imports stages/ nor advice/;
  stages/ never imports advice/; no import cycle among starvecheck's modules, imports
  inside functions included (those under `if TYPE_CHECKING:` never run);
- render/ and advice/ read metrics by labels: neither imports `re`;
- every metric a stage emits carries labels with a `quantity`, and lands in exactly one
  table of the terminal and Markdown renderers;
- every finding id is documented in the README or docs/.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from starvecheck.model import Report
from starvecheck.render.sections import stage_sections
from tests.conftest import run, tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "starvecheck"
GOLDEN = Path(__file__).parent / "golden"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST, package: str) -> Iterator[str]:
    """Every starvecheck module an import statement names, skipping TYPE_CHECKING blocks."""

    def visit(node: ast.AST) -> Iterator[str]:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (x for n in node.orelse for x in visit(n))
            return
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module lives in
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(tree)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for imported in _runtime_imports(ast.parse(path.read_text()), package):
            # A module importing its own ancestor package (`from starvecheck import
            # args`) runs that package's __init__, which is how packages load.
            ancestor = name.startswith(imported + ".")
            if imported in modules and imported != name and not ancestor:
                targets.add(imported)
        graph[name] = targets
    return graph


GRAPH = import_graph()


def _layer_violations(src: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if m.startswith(src)
        for t in targets
        if t.startswith(forbidden)
    )


def test_advice_never_imports_stages():
    assert _layer_violations("starvecheck.advice", ("starvecheck.stages",)) == []


def test_render_never_imports_stages_nor_advice():
    assert (
        _layer_violations("starvecheck.render", ("starvecheck.stages", "starvecheck.advice")) == []
    )


def test_stages_never_import_advice():
    assert _layer_violations("starvecheck.stages", ("starvecheck.advice",)) == []


def test_no_import_cycles():
    """Tarjan's strongly connected components over runtime imports: none has two modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            connect(v)
    assert cycles == []


def test_the_import_graph_sees_function_level_imports():
    # The check is only as good as the graph: commands import their stages inside
    # functions, and the graph must see that.
    assert "starvecheck.stages.registry" in GRAPH["starvecheck.cli.common"]


@pytest.mark.parametrize("layer", ["render", "advice"])
def test_render_and_advice_take_no_metric_name_apart(layer):
    offenders = [
        p.name
        for p in (SRC / layer).glob("*.py")
        if re.search(r"^\s*(import re\b|from re import)", p.read_text(), re.MULTILINE)
    ]
    assert offenders == []


# --- every metric: labelled, and in exactly one table ------------------------------


def _reports(tmp_path: Path) -> Iterator[tuple[str, Report]]:
    for p in sorted(GOLDEN.glob("*.json")):
        yield p.stem, Report.from_dict(json.loads(p.read_text()))
    tok = tiny_tokenizer(tmp_path / "tok")
    fresh = {
        "io": ("io", "--quick", "--runs", "1", "--threads", "1,2", str(tmp_path)),
        "loader": ("loader", "--quick", "--workers", "0,1", str(tmp_path)),
        "starve": ("starve", "--quick", "--workers", "0,1", "--sample-ms", "1", "--step-ms", "5"),
        "pad": ("pad", "--quick"),
        "pcie": ("pcie", "--quick"),
        "profile": ("profile", "--quick", "--workers", "0", "--tokenizer", str(tok), str(tmp_path)),
    }
    for name, argv in fresh.items():
        r = run(*argv, "--json", "-")
        assert r.exit_code in (0, 1, 3), (name, r.stderr)
        yield name, Report.from_dict(r.json)


@pytest.mark.slow
def test_every_metric_is_labelled_and_in_exactly_one_table(tmp_path):
    seen = set()
    for source, report in _reports(tmp_path):
        for stage in report.stages:
            metrics = [*stage.metrics, *([stage.capacity] if stage.capacity else [])]
            unlabelled = [m.name for m in metrics if "quantity" not in m.labels]
            assert unlabelled == [], (source, stage.stage, unlabelled)
            sections, rest = stage_sections(stage)
            placed = [id(m) for s in sections for m in s.metrics] + [id(m) for m in rest]
            assert sorted(placed) == sorted(id(m) for m in stage.metrics), (source, stage.stage)
            seen.add(stage.stage)
    assert {"io", "loader", "starve", "pad", "pcie", "profile"} <= seen


# --- every finding id documented --------------------------------------------------

_ID = re.compile(r'"((?:env|io|loader|starve|pad|pcie|profile|trace|doctor)\.[a-z0-9-]+)"')


def finding_ids() -> set[str]:
    found = set()
    for p in [*(SRC / "advice").glob("*.py"), SRC / "watcher.py"]:
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Finding":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.add(first.value)
    return found


def test_every_finding_id_is_documented():
    ids = finding_ids()
    assert len(ids) > 30  # the scan finds them: a broken scan must not pass quietly
    docs = (ROOT / "README.md").read_text()
    docs += "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(i for i in ids if i not in docs) == []


def _docs() -> str:
    text = (ROOT / "README.md").read_text()
    return text + "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))


def test_every_command_and_option_is_documented():
    import typer.main

    from starvecheck.cli.main import app

    docs = _docs()
    group = typer.main.get_command(app)
    assert len(group.commands) >= 9  # the scan sees the commands
    missing = []
    for name, command in group.commands.items():
        if f"starvecheck {name}" not in docs:
            missing.append(name)
        for param in command.params:
            missing += [f"{name} {o}" for o in param.opts if o.startswith("--") and o not in docs]
    assert missing == []


def test_every_metric_quantity_is_documented():
    """Every quantity a metric is labelled with in the source ("quantity": "x")."""
    import re

    found: set[str] = set()
    for p in SRC.rglob("*.py"):
        text = p.read_text()
        found |= set(re.findall(r'"quantity":\s*"([a-z_0-9]+)"', text))
        found |= set(re.findall(r'quantity="([a-z_0-9]+)"', text))
    assert len(found) > 30
    docs = _docs()
    assert sorted(q for q in found if q not in docs) == []
