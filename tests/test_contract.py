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


def documented(term: str, docs: str, *, segment: bool = False) -> bool:
    """`term` as a whole token of the docs, neither the head nor the tail of a longer
    one: `io.cold` is not documented by `io.cold-gap`, `--cold` not by `--cold-gap`,
    `starvecheck io` not by `starvecheck iostat`. A sentence's full stop may follow.
    `segment`: a quantity may be one dotted part of a metric's name (`wait_ms.w<N>`,
    `numa.remote_penalty`), never a part of a word (`wait_ms` in `data_wait_ms`)."""
    before, after = (
        (r"(?<![\w-])", r"(?![\w-])") if segment else (r"(?<![\w.-])", r"(?![\w-]|\.\w)")
    )
    return re.search(before + re.escape(term) + after, docs) is not None


def test_documented_takes_whole_tokens_only():
    text = "`io.cold-gap`, --cold-gap, starvecheck iostat, pre-io.rotational, env.shm.x"
    assert not any(
        documented(t, text)
        for t in ("io.cold", "--cold", "starvecheck io", "io.rotational", "env.shm", "cold")
    )
    text = "`io.cold`, (--cold) and starvecheck io. Then env.shm.\n--cold=2"
    assert all(documented(t, text) for t in ("io.cold", "--cold", "starvecheck io", "env.shm"))
    text = "`wait_ms.w<N>`, `numa.remote_penalty`, `data_wait_ms`, `idle_share_x`"
    assert all(documented(q, text, segment=True) for q in ("wait_ms", "remote_penalty"))
    assert not any(documented(q, text, segment=True) for q in ("data_wait", "idle_share"))


def _first_argument(call: ast.Call, keyword: str) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _id_helpers(tree: ast.AST) -> dict[str, tuple[str, ast.Call]]:
    """Functions that build a Finding from the tail of its id, as advice/env.py's
    `_finding("shm", ...)` builds `env.shm`: {name: (prefix, their Finding call)}."""
    helpers = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not fn.args.args:
            continue
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call) or getattr(call.func, "id", "") != "Finding":
                continue
            first = _first_argument(call, "id")
            if (
                isinstance(first, ast.JoinedStr)
                and len(first.values) == 2
                and isinstance(prefix := first.values[0], ast.Constant)
                and isinstance(tail := first.values[1], ast.FormattedValue)
                and getattr(tail.value, "id", "") == fn.args.args[0].arg
            ):
                helpers[fn.name] = (str(prefix.value), call)
    return helpers


def finding_ids() -> tuple[set[str], list[str]]:
    """Every finding id written in the source, and where a Finding's id could not be
    read (so that an id built some new way fails the test rather than going unchecked)."""
    found: set[str] = set()
    unread: list[str] = []
    for p in sorted(SRC.rglob("*.py")):
        tree = ast.parse(p.read_text())
        helpers = _id_helpers(tree)
        inside = {id(call) for _, call in helpers.values()}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or id(node) in inside:
                continue
            name = getattr(node.func, "id", "")
            if name != "Finding" and name not in helpers:
                continue
            first = _first_argument(node, "id" if name == "Finding" else "id_")
            prefix = helpers[name][0] if name in helpers else ""
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(prefix + first.value)
            else:
                unread.append(f"{p.relative_to(SRC)}:{node.lineno}")
    return found, unread


def test_every_finding_id_is_documented():
    ids, unread = finding_ids()
    assert unread == []
    # The scan finds them, every stage's: a broken scan must not pass quietly.
    assert len(ids) > 50
    stages = {"env", "io", "loader", "starve", "pad", "pcie", "profile", "doctor"}
    assert {i.partition(".")[0] for i in ids} >= stages
    docs = _docs()
    assert sorted(i for i in ids if not documented(i, docs)) == []


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
        if not documented(f"starvecheck {name}", docs):
            missing.append(name)
        for param in command.params:
            missing += [
                f"{name} {o}" for o in param.opts if o.startswith("--") and not documented(o, docs)
            ]
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
    assert sorted(q for q in found if not documented(q, docs, segment=True)) == []
