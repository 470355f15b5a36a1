"""Judging and showing read a stage's figures as its records, by attribute, never by a
label key (docs/development.md, "Figures as records"). A stage migrated to records
(core/schema/<stage>.py's `to_metrics`/`from_metrics`, `StageResult.records`) has its
advice and render modules off the allowlist below; the list only shrinks.

The scan finds every read of a label key in advice/ and render/: a keyword argument
of `select`, `one`, `value` or `matches` (`r.select(quantity="gbps")`), a subscript,
`.get` or `in` on a metric's labels (`m.labels["size"]`, `labels.get("group")`), and a
string key (an f-string too) into a mapping built from labels or judging's `verdicts`
(`v = {key(m.labels): m.value ...}; v["link.efficiency"]`), followed through
assignments and into the module's own functions' parameters."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "starvecheck"
READERS = frozenset({"select", "one", "value", "matches"})

# Modules not yet migrated to their stage's records: each still read label keys. Every
# stage's figures are records now, so none is left; never add one.
NOT_MIGRATED: frozenset[str] = frozenset()
MIGRATED = frozenset({
    "advice/attach.py", "advice/attachstages.py", "advice/attachwait.py",
    "advice/capacity.py", "advice/configurations.py", "advice/costs.py",
    "advice/factory.py", "advice/factory_bounds.py", "advice/factory_extra.py",
    "advice/factory_unread.py", "advice/io.py", "advice/loader.py", "advice/loadstages.py",
    "advice/pad.py", "advice/pcie.py", "advice/profile.py", "advice/samples.py",
    "advice/startmethod.py", "advice/starve.py", "advice/stepworkers.py",
    "advice/stragglers.py", "advice/trace.py", "render/attach.py", "render/factory.py",
    "render/loader.py", "render/loadstages.py", "render/pad.py", "render/pcie.py",
    "render/plot.py", "render/profile.py", "render/sweep.py", "render/throughput.py",
    "render/trace.py",
})  # fmt: skip

Read = tuple[int, str]  # (line, what was read)


def _is_labels(node: ast.AST, aliases: set[str]) -> bool:
    """A metric's labels: `x.labels`, or a name given them (`labels = m.labels`)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "labels"
    return isinstance(node, ast.Name) and node.id in aliases


def _key(node: ast.AST) -> str | None:
    """A key spelled out: a string, or an f-string (`f"overlap.{mem}.{mode}"`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return ast.unparse(node)
    return None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _mentions_labels(node: ast.AST, derived: set[str]) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "labels" for n in ast.walk(node)) or bool(
        _names(node) & derived
    )


def _targets(node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(target, value) of each assignment, a tuple unpacked pairwise where it can be."""
    pairs: list[tuple[ast.AST, ast.AST | None]] = []
    if isinstance(node, ast.Assign):
        pairs = [(t, node.value) for t in node.targets]
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
        pairs = [(node.target, node.value)]
    elif isinstance(node, ast.For | ast.comprehension):
        pairs = [(node.target, node.iter)]
    for target, value in pairs:
        if value is None:
            continue
        pairwise = isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
        if pairwise and len(target.elts) == len(value.elts):
            yield from zip(target.elts, value.elts, strict=True)
            continue
        yield target, value


def _labelled_dict(node: ast.AST, derived: set[str], makers: set[str]) -> bool:
    """A mapping keyed by what labels hold: a dict built with such keys, a call of a
    function that returns one, judging's `verdicts`."""
    if isinstance(node, ast.Attribute) and node.attr == "verdicts":
        return True
    if isinstance(node, ast.DictComp | ast.Dict):
        keys = [node.key] if isinstance(node, ast.DictComp) else [k for k in node.keys if k]
        return any(_mentions_labels(k, derived) for k in keys)
    call = node.func if isinstance(node, ast.Call) else None
    return isinstance(call, ast.Name) and call.id in makers


class _Scope:
    """One outermost function (its nested functions and lambdas with it)."""

    def __init__(self, node: ast.AST) -> None:
        self.node = node
        self.aliases: set[str] = set()  # names of a metric's labels
        self.derived: set[str] = set()  # names computed from labels
        self.dicts: set[str] = set()  # mappings keyed by what labels hold
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.aliases |= {  # a parameter given a metric's labels
                a.arg
                for a in (*node.args.args, *node.args.kwonlyargs)
                if a.arg == "labels" or "Labels" in ast.unparse(a.annotation or ast.Constant(""))
            }

    def settle(self, makers: set[str]) -> None:
        size = -1
        while size != len(self.aliases) + len(self.derived) + len(self.dicts):
            size = len(self.aliases) + len(self.derived) + len(self.dicts)
            for n in ast.walk(self.node):
                for target, value in _targets(n):
                    names = _names(target) if isinstance(target, ast.Name | ast.Tuple) else set()
                    if isinstance(value, ast.Attribute) and value.attr == "labels":
                        self.aliases |= names
                    elif _labelled_dict(value, self.derived | self.aliases, makers):
                        self.dicts |= names
                    elif _mentions_labels(value, self.derived | self.aliases):
                        self.derived |= names
                    if (
                        isinstance(target, ast.Subscript)
                        and isinstance(target.value, ast.Name)
                        and _mentions_labels(target.slice, self.derived | self.aliases)
                    ):
                        self.dicts.add(target.value.id)
                if (
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "setdefault"
                    and isinstance(n.func.value, ast.Name)
                    and n.args
                    and _mentions_labels(n.args[0], self.derived | self.aliases)
                ):
                    self.dicts.add(n.func.value.id)

    def keyed(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in self.dicts) or (
            isinstance(node, ast.Attribute) and node.attr == "verdicts"
        )

    def reads(self) -> Iterator[Read]:
        for n in ast.walk(self.node):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in READERS:
                    yield from ((n.lineno, f"{name}({k.arg}=)") for k in n.keywords if k.arg)
                if name == "get" and isinstance(f, ast.Attribute) and n.args:
                    key = _key(n.args[0])
                    if key is not None and (
                        _is_labels(f.value, self.aliases) or self.keyed(f.value)
                    ):
                        yield n.lineno, f"{ast.unparse(f.value)}.get({key})"
            elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load):
                key = _key(n.slice)
                if key is not None and (_is_labels(n.value, self.aliases) or self.keyed(n.value)):
                    yield n.lineno, f"{ast.unparse(n.value)}[{key}]"
            elif isinstance(n, ast.Compare) and any(isinstance(o, ast.In) for o in n.ops):
                key, where = _key(n.left), n.comparators[0]
                if key is not None and (_is_labels(where, self.aliases) or self.keyed(where)):
                    yield n.lineno, f"{key} in {ast.unparse(where)}"


def _outermost(tree: ast.Module) -> list[ast.AST]:
    found: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node)
        elif isinstance(node, ast.ClassDef):
            found += [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
        else:
            found.append(node)
    return found


def label_key_reads(source: str) -> list[Read]:
    """Every label-key read in a module's source, by line."""
    tree = ast.parse(source)
    scopes = [_Scope(n) for n in _outermost(tree)]
    functions = {
        s.node.name: s for s in scopes if isinstance(s.node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    makers: set[str] = set()
    size = -1
    while size != sum(len(s.dicts) for s in scopes) + len(makers):
        size = sum(len(s.dicts) for s in scopes) + len(makers)
        for s in scopes:
            s.settle(makers)
            _hand_on(s, functions)
        makers |= {
            name
            for name, s in functions.items()
            for r in ast.walk(s.node)
            if isinstance(r, ast.Return)
            and r.value is not None
            and _labelled_dict(r.value, s.derived | s.aliases, makers)
        }
    return sorted({r for s in scopes for r in s.reads()})


def _hand_on(scope: _Scope, functions: dict[str, _Scope]) -> None:
    """A labels-keyed mapping passed to one of the module's functions keys its parameter."""
    for n in ast.walk(scope.node):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            continue
        callee = functions.get(n.func.id)
        if callee is None or not isinstance(callee.node, ast.FunctionDef):
            continue
        params = [a.arg for a in callee.node.args.args]
        given = list(zip(params, n.args, strict=False))
        given += [(k.arg, k.value) for k in n.keywords if k.arg]
        callee.dicts |= {p for p, arg in given if scope.keyed(arg)}


def _modules() -> dict[str, list[Read]]:
    return {
        str(p.relative_to(SRC)): label_key_reads(p.read_text())
        for layer in ("advice", "render")
        for p in sorted((SRC / layer).rglob("*.py"))
    }


def test_the_scan_sees_each_kind_of_label_key_read():
    code = """
def key(labels):
    return labels["direction"]

def _values(result):
    return {key(m.labels): m.value for m in result.metrics}

def table(v, judged):
    return v.get("link.gen_max"), judged.get(f"overlap_verdict.{mem}")

def reads(result, stage):
    a = result.select(quantity="gbps", memory="pinned")
    b = m.labels["size"]
    labels = m.labels
    c = labels.get("group")
    d = "variant" in m.labels
    v, p = _values(result), result.parameters
    e = v[f"d2h.pinned.{size}"]
    f = "reference_ratio" in v
    g = table(v, stage.judged.verdicts)
    link = {}
    q = str(labels.get("quantity"))
    link[f"link.{q}"] = m
    h = link.get("link.efficiency")
    i = stage.judged.verdicts["link_peak_gbps.idle"]
    j = p.get("cuda"), m.labels, select(metrics, **want)
"""
    assert label_key_reads(code) == [
        (3, "labels[direction]"),
        (9, "judged.get(f'overlap_verdict.{mem}')"),
        (9, "v.get(link.gen_max)"),
        (12, "select(memory=)"),
        (12, "select(quantity=)"),
        (13, "m.labels[size]"),
        (15, "labels.get(group)"),
        (16, "variant in m.labels"),
        (18, "v[f'd2h.pinned.{size}']"),
        (19, "reference_ratio in v"),
        (22, "labels.get(quantity)"),
        (24, "link.get(link.efficiency)"),
        (25, "stage.judged.verdicts[link_peak_gbps.idle]"),
    ]  # line 26: a parameter, the labels passed whole and **want are no label keys


def test_a_migrated_stage_reads_its_figures_by_attribute_alone():
    reads = _modules()
    assert {m: reads[m] for m in MIGRATED} == {m: [] for m in MIGRATED}


def test_only_the_modules_not_yet_migrated_read_label_keys_and_each_still_does():
    reading = {m for m, r in _modules().items() if r}
    assert reading - NOT_MIGRATED == set(), "read the stage's records (StageResult.records)"
    assert NOT_MIGRATED - reading == set(), "migrated: take it off NOT_MIGRATED"
    assert not MIGRATED & NOT_MIGRATED
