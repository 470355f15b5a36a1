"""The contract between measuring, judging and showing (as psutil's test_contracts):

- layers, type-only imports (`if TYPE_CHECKING:`) included: advice/ never imports
  stages/; render/ never imports stages/, advice/ nor probe/; stages/ never imports
  advice/; probe/ imports only probe/ and the basics (core's status, units, the
  machine record and the JSON types), which import nothing of starvecheck but each
  other; core/ imports only core/; inputs/ and scratch/ only
  core/ and probe/ (and themselves); no stage imports another stage's module or
  folder, and the machinery stages share (stages/samples/, stages/dataloader/, the
  contract modules) imports no stage; advice/ imports only core/, probe/ and inputs/,
  render/ only core/;
- advice/ and render/ read a stage's parameters through their typed accessors
  (core/parameters.py), never by a key written out;
- no import cycle among starvecheck's modules, imports inside functions included;
  counting type-only imports, none either;
- render/ and advice/ read metrics by labels: neither imports `re`;
- every metric a stage emits carries labels with a `quantity`, and lands in exactly one
  table of the terminal and Markdown renderers;
- every finding id, command, option and metric quantity is documented in the README
  or docs/, as a whole token;
- no module over 450 lines, no function over 80, but those allowed with a reason.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from starvecheck.core import catalogue
from starvecheck.core import stages as stages_table
from starvecheck.core.catalogue import CATALOGUE
from starvecheck.core.model import Finding, Severity
from starvecheck.core.report import Report
from starvecheck.render.sections import stage_sections
from tests.conftest import run, tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "starvecheck"
GOLDEN = Path(__file__).parent / "golden"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, package: str, *, type_checking: bool = False) -> Iterator[str]:
    """Every starvecheck module an import statement names; those under `if
    TYPE_CHECKING:` only with `type_checking` (they never run, but still tie the
    module to the one they name)."""

    def visit(node: ast.AST) -> Iterator[str]:
        if (
            not type_checking
            and isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
        ):
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


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        tree = ast.parse(path.read_text())
        for imported in _imports(tree, package, type_checking=type_checking):
            # A module importing its own ancestor package (`from starvecheck import
            # args`) runs that package's __init__, which is how packages load.
            ancestor = name.startswith(imported + ".")
            if imported in modules and imported != name and not ancestor:
                targets.add(imported)
        graph[name] = targets
    return graph


GRAPH = import_graph()  # what runs: imports inside functions included
FULL_GRAPH = import_graph(type_checking=True)  # and those only a type checker reads


def _layer_violations(src: str, forbidden: tuple[str, ...]) -> list[str]:
    """Every import, type-only ones included, from the layer `src` into `forbidden`."""
    return sorted(
        f"{m} imports {t}"
        for m, targets in FULL_GRAPH.items()
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


# probe/ reads the machine and sits under everything: it may import itself and these
# basics, which import nothing of starvecheck but each other: the machine record it
# fills (declared in the vocabulary, so render/ reads it) and the JSON types it names.
PROBE_MAY_IMPORT = (
    "starvecheck.core.status",
    "starvecheck.core.units",
    "starvecheck.core.schema.machine",
    "starvecheck.core.jsonvalue",
)


def _escapes(src: str, allowed: tuple[str, ...]) -> list[str]:
    """Every import from the package `src` to a starvecheck module outside `allowed`
    (type-only imports included)."""
    return sorted(
        f"{m} imports {t}"
        for m, targets in FULL_GRAPH.items()
        if m == src or m.startswith(src + ".")
        for t in targets
        if not any(t == a or t.startswith(a + ".") for a in allowed)
    )


def test_core_imports_only_core():
    """core/ is the vocabulary every layer speaks: it stands on nothing of ours."""
    assert any(m.startswith("starvecheck.core.") for m in FULL_GRAPH)
    assert _escapes("starvecheck.core", ("starvecheck.core",)) == []


@pytest.mark.parametrize(
    "package", ["starvecheck.inputs", "starvecheck.scratch", "starvecheck.loading"]
)
def test_inputs_and_scratch_import_only_core_and_probe(package):
    """...and loading/, which runs inside the user's workers: what it imports, every
    worker of a spawn or forkserver pipeline imports."""
    assert any(m.startswith(package + ".") for m in FULL_GRAPH)
    allowed = (package, "starvecheck.core", "starvecheck.probe")
    assert _escapes(package, allowed) == []


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("starvecheck.advice", ("starvecheck.core", "starvecheck.probe", "starvecheck.inputs")),
        ("starvecheck.render", ("starvecheck.core",)),
    ],
)
def test_judging_and_showing_stand_on_the_vocabulary(package, allowed):
    """advice/ judges results with the machine's facts and the workload; render/ shows
    a report, which holds everything it prints."""
    assert _escapes(package, (package, *allowed)) == []


def _stage_parts() -> tuple[str, ...]:
    """Each stage's own part of stages/, from the stage table: a module (a link without
    parts) or a folder of its parts; a stage measured inside another's folder (factory in
    loader/) belongs to that one, and a stage with no measuring module of its own
    (doctor, which runs the others) to its name's folder where it has one."""
    parts = {e.measure.split(".")[1] for e in stages_table.TABLE if e.measure}
    named = {
        e.name
        for e in stages_table.TABLE
        if (SRC / "stages" / e.name).is_dir() or (SRC / "stages" / f"{e.name}.py").is_file()
    }
    return tuple(sorted(parts | named))


STAGES = _stage_parts()


def _stage_of(module: str) -> str | None:
    """The stage a module of stages/ belongs to; None for the machinery they share."""
    parts = module.split(".")
    if parts[:2] != ["starvecheck", "stages"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in STAGES else None


def test_no_stage_imports_another_stage():
    """A stage reaches the others only through the registry (by name, at run time);
    what several need lives in the machinery they share, which imports none of them."""
    assert {"env", "loader", "doctor", "attach"} <= set(STAGES)  # the table was read
    assert {_stage_of(m) for m in FULL_GRAPH} >= set(STAGES)  # the names are there
    offences = sorted(
        f"{m} imports {t}"
        for m, targets in FULL_GRAPH.items()
        if m.startswith("starvecheck.stages.")
        for t in targets
        if _stage_of(t) is not None and _stage_of(t) != _stage_of(m)
    )
    assert offences == []


def _parameters(node: ast.AST) -> bool:
    """`x.parameters`, or a name that holds a stage's parameters (`params`)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "parameters"
    return isinstance(node, ast.Name) and node.id in ("params", "parameters")


def parameter_keys(tree: ast.AST) -> list[int]:
    """Lines that read a stage's parameters by a key written out: `params["x"]`,
    `r.parameters.get("x")`, `"x" in params`."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and _parameters(node.value):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and _parameters(node.func.value)
            and node.args
        ):
            key = node.args[0]
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(o, ast.In) for o in node.ops)
            and any(_parameters(c) for c in node.comparators)
        ):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append(node.lineno)
    return found


def test_parameter_reads_are_seen():
    code = 'a = params["x"]\nb = r.parameters.get("y", 1)\nc = "z" in params\nd = params.cpus\n'
    assert parameter_keys(ast.parse(code)) == [1, 2, 3]


@pytest.mark.parametrize("layer", ["advice", "render"])
def test_judging_and_showing_read_parameters_by_their_accessors(layer):
    offences = [
        f"{p.relative_to(SRC)}:{line}"
        for p in sorted((SRC / layer).rglob("*.py"))
        for line in parameter_keys(ast.parse(p.read_text()))
    ]
    assert offences == []


def _in_probe(module: str) -> bool:
    return module == "starvecheck.probe" or module.startswith("starvecheck.probe.")


def test_probe_imports_nothing_above_it():
    """Everything probe/ reaches, type-only imports included, is probe/ or a basic."""
    allowed = {m for m in FULL_GRAPH if _in_probe(m)} | set(PROBE_MAY_IMPORT)
    assert allowed > {"starvecheck.probe.machine", *PROBE_MAY_IMPORT}  # the names exist
    # From the basics too: they stay leaves whether or not probe/ imports them today.
    reached, todo, offences = set(), sorted(allowed), []
    while todo:
        m = todo.pop()
        reached.add(m)
        for t in sorted(FULL_GRAPH[m]):
            if t not in allowed:
                offences.append(f"{m} imports {t}")
            elif t not in reached:
                todo.append(t)
    assert offences == []


@pytest.mark.parametrize(
    "module", sorted(m for m in FULL_GRAPH if m.startswith("starvecheck.render"))
)
def test_render_never_imports_probe(module):
    """render/ shows a report: what it knows of the machine is in `report.machine`."""
    assert sorted(t for t in FULL_GRAPH[module] if _in_probe(t)) == []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, each sorted."""
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
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(cycles)


def test_no_import_cycles():
    """Among the imports that run: none, imports inside functions included."""
    assert import_cycles(GRAPH) == []


def test_no_import_cycles_counting_type_checking():
    """Counting imports under `if TYPE_CHECKING:` too: a type named across layers is an
    arrow like any other, so a cycle through one is a cycle."""
    assert import_cycles(FULL_GRAPH) == []


def test_the_import_graph_sees_function_level_imports():
    # The check is only as good as the graph: commands import their stages inside
    # functions, and the graph must see that.
    assert "starvecheck.stages.registry" in GRAPH["starvecheck.cli.common"]


def test_the_full_graph_sees_type_checking_imports():
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from starvecheck.a import A\nelse:\n    import starvecheck.b\n"
        "def f():\n    from . import c\n"
    )
    tree = ast.parse(code)
    runtime = set(_imports(tree, "starvecheck"))
    full = set(_imports(tree, "starvecheck", type_checking=True))
    assert "starvecheck.a" not in runtime and {"starvecheck.b", "starvecheck.c"} <= runtime
    assert full - runtime == {"starvecheck.a", "starvecheck.a.A"}
    assert len(FULL_GRAPH) == len(GRAPH) and all(GRAPH[m] <= FULL_GRAPH[m] for m in GRAPH)


# --- small modules, short functions (STYLE.md: "a few hundred lines") --------------

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80

# The present offenders, each with why it is long today. A new long module or function
# fails; one split below its limit fails too until its line here is removed.
LONG = {
    "cli/doctor.py::doctor": (
        "a Typer command: its signature declares every option (the body is 21 lines)"
    ),
    "cli/io.py::io": (
        "a Typer command: its signature declares every option (the body is 11 lines)"
    ),
    "cli/loader.py::loader": (
        "a Typer command: its signature declares every option (the body is 27 lines)"
    ),
    "cli/pad.py::pad": (
        "a Typer command: its signature declares every option (the body is 18 lines)"
    ),
    "cli/profile.py::profile": (
        "a Typer command: its signature declares every option (the body is 23 lines)"
    ),
}


def long_code() -> dict[str, int]:
    """{module: lines} over MAX_MODULE_LINES and {module::function: lines} over
    MAX_FUNCTION_LINES (methods and nested functions by their dotted names), under src/."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, where: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found[f"{where}::{name}"] = lines
                visit(child, where, name + ".")
            else:
                visit(child, where, prefix)

    for p in sorted(SRC.rglob("*.py")):
        where = p.relative_to(SRC).as_posix()
        text = p.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found[where] = len(text.splitlines())
        visit(ast.parse(text), where, "")
    return found


def test_no_long_module_or_function_but_those_allowed():
    assert long_code()  # the scan sees them (the allowed ones exist)
    assert {k: n for k, n in long_code().items() if k not in LONG} == {}


def test_every_allowed_long_one_is_still_long():
    """Split one below its limit, and its line in LONG goes."""
    assert sorted(set(LONG) - set(long_code())) == []


@pytest.mark.parametrize("layer", ["render", "advice"])
def test_render_and_advice_take_no_metric_name_apart(layer):
    offenders = [
        p.name
        for p in (SRC / layer).glob("*.py")
        if re.search(r"^\s*(import re\b|from re import)", p.read_text(), re.MULTILINE)
    ]
    assert offenders == []


# --- every metric: labelled, and in exactly one table ------------------------------


# Reports of each measuring command, as this code writes them, stored so the fast lane
# checks every metric's labels without measuring (the slow test below checks that they
# are still what the commands write, and rewrites them with STARVECHECK_REGOLDEN=1).
LABELS = GOLDEN / "labels"


def _fresh(tmp_path: Path) -> Iterator[tuple[str, dict]]:
    tok = tiny_tokenizer(tmp_path / "tok")
    fresh = {
        "io": ("io", "--quick", "--runs", "1", "--threads", "1,2", str(tmp_path)),
        "loader": ("loader", "--quick", "--workers", "0,1", str(tmp_path)),
        "starve": ("starve", "--quick", "--workers", "0,1", "--sample-ms", "1", "--step-ms", "5"),
        "pad": ("pad", "--quick"),
        "pcie": ("pcie", "--quick"),
        "profile": ("profile", "--quick", "--workers", "0", "--tokenizer", str(tok), str(tmp_path)),
    }
    assert set(fresh) == {p.stem for p in LABELS.glob("*.json")}  # each stored report's
    for name, argv in fresh.items():
        r = run(*argv, "--json", "-")
        assert r.exit_code in (0, 1, 3), (name, r.stderr)
        yield name, r.json


def _reports() -> Iterator[tuple[str, Report]]:
    for p in (*sorted(GOLDEN.glob("*.json")), *sorted(LABELS.glob("*.json"))):
        yield p.stem, Report.from_dict(json.loads(p.read_text()))


def _shapes(report: dict) -> set[tuple[str, str, tuple[str, ...]]]:
    """(stage, quantity, label keys) of every metric: what the tables select by."""
    return {
        (s["stage"], str(m.get("labels", {}).get("quantity")), tuple(sorted(m.get("labels", {}))))
        for s in report["stages"]
        for m in s.get("metrics", ())
    }


def test_every_metric_is_labelled_and_in_exactly_one_table():
    seen = set()
    for source, report in _reports():
        for stage in report.stages:
            metrics = [*stage.figures, *([stage.delivers] if stage.delivers else [])]
            unlabelled = [m.name for m in metrics if "quantity" not in m.labels]
            assert unlabelled == [], (source, stage.stage, unlabelled)
            sections, rest = stage_sections(stage)
            placed = [id(m) for s in sections for m in s.metrics] + [id(m) for m in rest]
            assert sorted(placed) == sorted(id(m) for m in stage.figures), (source, stage.stage)
            seen.add(stage.stage)
    stored = {p.stem for p in LABELS.glob("*.json")}  # the six measuring commands'
    assert len(stored) >= 6 and stored | set(stages_table.doctor_chain()) <= seen


@pytest.mark.slow
def test_the_stored_reports_are_what_the_commands_write(tmp_path):
    """The goldens the label check reads still have the metrics the commands write:
    the same stages, quantities and label keys."""
    regolden = os.environ.get("STARVECHECK_REGOLDEN") == "1"
    for name, report in _fresh(tmp_path):
        stored = LABELS / f"{name}.json"
        if regolden:
            stored.write_text(json.dumps(report, indent=1) + "\n")
        assert _shapes(json.loads(stored.read_text())) == _shapes(report), name


# --- no test passes vacuously --------------------------------------------------------


def _vacuous_returns(path: Path) -> list[str]:
    """`if ...: return` in a test before it asserted anything: where that branch is
    taken the test passes having checked nothing (it must skip, saying why)."""
    found = []
    for fn in ast.parse(path.read_text()).body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")):
            continue
        asserted = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Assert)]
        for node in ast.walk(fn):
            returns = isinstance(node, ast.If) and any(
                isinstance(st, ast.Return) and st.value is None for st in node.body
            )
            if returns and not any(line < node.lineno for line in asserted):
                found.append(f"{path.name}:{node.lineno} {fn.name}")
    return found


def test_no_test_returns_before_it_asserted_anything(tmp_path):
    tests = Path(__file__).parent
    assert [hit for p in sorted(tests.glob("test_*.py")) for hit in _vacuous_returns(p)] == []
    bad = tmp_path / "test_bad.py"
    bad.write_text("def test_x(workers=0):\n    if workers == 0:\n        return\n    assert 1\n")
    assert _vacuous_returns(bad) == ["test_bad.py:2 test_x"]  # the check can fail


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


def _spelled_ids() -> list[str]:
    """Where a finding id of the catalogue is written as a string outside it, or a
    Finding is built from a string literal: each id must be spelled once."""
    found = []
    for p in sorted(SRC.rglob("*.py")):
        if p == SRC / "core" / "catalogue.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            where = f"{p.relative_to(SRC)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Constant) and node.value in CATALOGUE:
                found.append(f"{where} {node.value}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Finding":
                first = _first_argument(node, "id")
                if isinstance(first, ast.Constant | ast.JoinedStr):
                    found.append(f"{where} Finding({ast.unparse(first)}, ...)")
    return found


def test_every_finding_id_is_spelled_in_the_catalogue_alone():
    assert _spelled_ids() == []


def test_every_kind_of_the_catalogue_is_given_somewhere():
    used = set()
    for p in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "catalogue":
                used.add(node.attr)
    names = {name for name, v in vars(catalogue).items() if isinstance(v, catalogue.Kind)}
    assert len(names) > 70  # every stage's: a broken scan must not pass quietly
    assert sorted(names - used) == []


def test_a_kind_refuses_a_severity_it_does_not_list():
    with pytest.raises(ValueError, match=r"env\.no-gpu is never critical"):
        Finding(catalogue.ENV_NO_GPU, Severity.CRITICAL, "no NVIDIA GPU is visible")
    assert Finding(catalogue.ENV_NO_GPU, Severity.INFO, "t").to_dict()["id"] == "env.no-gpu"
    # Judging may lower a severity (a gain inside the noise), never raise one.
    assert Finding(catalogue.IO_SMALL_FILES, Severity.INFO, "t").severity is Severity.INFO


def test_a_kind_crosses_processes_as_itself():
    """Findings are pickled (torch.distributed gathers every rank's): a kind comes back
    as the catalogue's own, and an id it does not know as the plain string."""
    import copy
    import pickle

    f = Finding(catalogue.IO_SMALL_FILES, Severity.WARNING, "t")
    for back in (pickle.loads(pickle.dumps(f)), copy.deepcopy(f)):
        assert back == f and back.id is catalogue.IO_SMALL_FILES
    assert catalogue.kind("io.gone-in-a-later-version") == "io.gone-in-a-later-version"


def test_every_finding_id_is_documented():
    ids = set(CATALOGUE)
    # Every stage of the table gives findings, under the name it reports as; no id names
    # a stage the table does not have.
    assert {i.partition(".")[0] for i in ids} == {e.shown_as for e in stages_table.TABLE}
    docs = _docs()
    assert sorted(i for i in ids if not documented(i, docs)) == []


def test_the_design_the_code_cites_is_in_the_repository():
    """The principles and conventions the code cites live in docs/architecture.md: no
    file of the project points at a design document outside it."""
    outside = re.compile(r"\bDESIGN\.md\b")
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for top in ("src", "tests", "benchmarks", "scripts", "examples"):
        files += [p for p in (ROOT / top).rglob("*.py") if p.resolve() != Path(__file__).resolve()]
    assert len(files) > 100
    assert [str(p.relative_to(ROOT)) for p in files if outside.search(p.read_text())] == []
    assert "## Principles" in (ROOT / "docs" / "architecture.md").read_text()


def _docs() -> str:
    text = (ROOT / "README.md").read_text()
    return text + "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))


def test_every_command_and_option_is_documented():
    import typer.main

    from starvecheck.cli.main import app

    docs = _docs()
    group = typer.main.get_command(app)
    assert len(group.commands) == len(stages_table.commands())  # the scan sees them all
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
    """Every quantity a metric is labelled with: in the source ("quantity": "x") and in
    every stored report (tests/golden: every stage has one), where a stage's records
    spell their quantities as enums and tables."""
    found: set[str] = set()
    for p in SRC.rglob("*.py"):
        text = p.read_text()
        found |= set(re.findall(r'"quantity":\s*"([a-z_0-9]+)"', text))
        found |= set(re.findall(r'quantity="([a-z_0-9]+)"', text))
    for p in GOLDEN.glob("*.json"):
        for stage in json.loads(p.read_text()).get("stages", []):
            for m in stage.get("metrics", []):
                q = m.get("labels", {}).get("quantity")
                found |= {q} if isinstance(q, str) else set()
    assert len(found) > 30
    docs = _docs()
    assert sorted(q for q in found if not documented(q, docs, segment=True)) == []
