"""A stage's words are spelled once (core/schema/): a label value that more than one
module writes or reads, and a nested record's keys, live in the stage's vocabulary
module; every other module names them by the constant or the record's field."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import re
from collections import defaultdict
from pathlib import Path

import pytest

from starvecheck.core import schema
from starvecheck.core.parameters import Parameters
from starvecheck.core.schema.attach import Gpu, Rank
from starvecheck.core.schema.factory import Configuration
from starvecheck.core.schema.nodes import Node
from starvecheck.core.schema.record import Record
from starvecheck.core.schema.steps import Run

SRC = Path(__file__).resolve().parent.parent / "src" / "starvecheck"
SCHEMA = SRC / "core" / "schema"

# The labels whose values are a stage's words (a metric's dimensions); a worker count,
# a size, a rank or a pid are figures, not words.
LABEL_KEYS = frozenset({
    "quantity", "layout", "cache", "kind", "source", "role", "process", "activity",
    "strategy", "direction", "memory", "mode", "pinned", "pattern", "clock", "phase",
})  # fmt: skip


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _label_read(node: ast.AST) -> str | None:
    """The label key `x.labels.get("k")` or `x.labels["k"]` reads, if it is one."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and "labels" in ast.unparse(node.func.value)
    ):
        key = node.args[0]
    elif isinstance(node, ast.Subscript) and "labels" in ast.unparse(node.value):
        key = node.slice
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def label_values(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(label, value, line) for each label value spelled out: a keyword argument
    (`select(m, quantity="x")`), a dict's entry (`{"layout": "own"}`), a comparison
    with a label read (`m.labels.get("role") == "workers"`). numpy's `kind=` is not a
    label."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            if ast.unparse(n.func).startswith(("np.", "numpy.")) or ast.unparse(n.func).endswith(
                "argsort"
            ):
                continue
            found += [
                (k.arg, v, n.lineno)
                for k in n.keywords
                if k.arg in LABEL_KEYS
                for v in _strings(k.value)
            ]
        elif isinstance(n, ast.Dict):
            found += [
                (k.value, v, n.lineno)
                for k, val in zip(n.keys, n.values, strict=True)
                if isinstance(k, ast.Constant) and k.value in LABEL_KEYS
                for v in _strings(val)
            ]
        elif isinstance(n, ast.Compare) and (key := _label_read(n.left)) in LABEL_KEYS:
            found += [(key, v, n.lineno) for c in n.comparators for v in _strings(c)]
    return found


def _modules() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if SCHEMA not in p.parents]


def test_the_scan_sees_each_way_a_label_value_is_spelled():
    code = (
        'a = select(m, quantity="x", layout="own", workers=2)\n'
        'b = {"role": "workers", "rank": "3"}\n'
        'c = m.labels.get("kind") == "data"\n'
        'd = np.argsort(x, kind="stable")\n'
        'e = p.labels["process"] in ("main", "worker")\n'
    )
    assert sorted(label_values(ast.parse(code))) == [
        ("kind", "data", 3),
        ("layout", "own", 1),
        ("process", "main", 5),
        ("process", "worker", 5),
        ("quantity", "x", 1),
        ("role", "workers", 2),
    ]


def test_no_label_value_is_spelled_in_more_than_one_module():
    where: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in _modules():
        for key, value, _ in label_values(ast.parse(path.read_text())):
            where[key, value].add(str(path.relative_to(SRC)))
    twice = {f"{k}={v}": sorted(m) for (k, v), m in where.items() if len(m) > 1}
    assert twice == {}, "spell these once, in core/schema/, and import them"


def _records() -> list[type[Record]]:
    found: list[type[Record]] = []
    for info in pkgutil.iter_modules(schema.__path__):
        module = importlib.import_module(f"{schema.__name__}.{info.name}")
        found += [
            v
            for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, Record) and v is not Record
            and v.__module__ == module.__name__
        ]  # fmt: skip
    return found


def test_the_records_are_the_ones_named_here():
    assert set(_records()) >= {Configuration, Rank, Gpu, Run, Node}


def _labels(node: ast.AST) -> bool:
    """A metric's labels or a finding's settings (`fix`): mappings of their own words."""
    return ast.unparse(node).endswith((".labels", ".fix"))


def _keys_read(tree: ast.AST) -> set[str]:
    """The strings a module reads a mapping by, labels and settings apart: subscripts,
    `.get("k")`, `"k" in x`."""
    keys: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and not _labels(n.value):
            keys |= set(_strings(n.slice))
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get"
            and n.args
            and not _labels(n.func.value)
        ):
            keys |= set(_strings(n.args[0]))
        elif (
            isinstance(n, ast.Compare)
            and any(isinstance(o, ast.In) for o in n.ops)
            and not _labels(n.comparators[0])
        ):
            keys |= set(_strings(n.left))
    return keys


def _schema_imports(tree: ast.AST) -> set[str]:
    """The names a module imports from the vocabulary modules (`module.Name`)."""
    return {
        f"{n.module}.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(schema.__name__ + ".")
        for a in n.names
    }


def test_the_key_scan_sees_each_read_but_a_label_read():
    code = 'a = x["pid"]\nb = y.get("role")\nc = "data_path" in z\nd = m.labels["workers"]\n'
    assert _keys_read(ast.parse(code)) == {"pid", "role", "data_path"}


@pytest.mark.parametrize("record", _records(), ids=lambda r: r.__name__)
def test_judging_and_showing_read_a_record_by_its_fields_never_by_a_key(record):
    """advice/, render/ and cli/ read a nested record through its stage's parameters
    (`records(Rank)`), typed; a module that names the record never reads one of its
    keys off a mapping, the old way (advice/attach read `x.get("pid")` off
    `parameters.ranks`)."""
    fields = {f.name for f in dataclasses.fields(record)}
    offences = {
        str(path.relative_to(SRC)): sorted(spelled)
        for layer in ("advice", "render", "cli")
        for path in sorted((SRC / layer).rglob("*.py"))
        if f"{record.__module__}.{record.__name__}"
        in _schema_imports(tree := ast.parse(path.read_text()))
        and (spelled := _keys_read(tree) & fields)
    }
    assert offences == {}


@pytest.mark.parametrize("record", _records(), ids=lambda r: r.__name__)
def test_a_record_reads_back_as_written(record):
    made = record.from_dict({f.name: _example(f.type) for f in dataclasses.fields(record)})
    assert made is not None
    assert record.from_dict(made.to_dict()) == made


def _example(kind: object) -> object:
    text = str(kind)
    if "tuple" in text:
        return [1, 2]
    if text.startswith("int"):
        return 3
    if text.startswith("float"):
        return 1.5
    if text.startswith("bool"):
        return True
    return "x"


def test_a_stored_record_of_the_wrong_shape_reads_as_its_defaults_or_not_at_all():
    assert Rank.from_dict({"pid": "12"}) is None  # what identifies it is missing
    assert Rank.from_dict([1, 2]) is None
    odd = Rank.from_dict({"pid": 12, "rank": True, "workers": ["a"], "stopped_s": 2})
    assert odd == Rank(12, stopped_s=2)  # a bool is no rank; an int is a float
    assert Configuration.read_all([{"role": "workers", "workers": 2}, "x", {}]) == (
        Configuration("workers", 2),
    )


def test_a_stage_reads_its_records_typed_through_its_parameters():
    from starvecheck.core.schema.attach import Parameters as AttachParameters

    p = Parameters({"ranks": [{"pid": 7, "rank": 1, "workers": [8, 9]}, "junk"], "seconds": 4})
    attach = p.read(AttachParameters)
    assert attach.ranks == (Rank(7, 1, workers=(8, 9)),)
    assert attach.seconds == 4
    assert p.read(AttachParameters) is not p and attach.read(AttachParameters) is attach


# Where `Any` stays at a seam, and why: what comes from outside starvecheck (the user's
# batch, the trainer package's own objects), typed by its owner or by nothing.
OUTSIDE = {
    "starvecheck.inputs.fingerprints": "the user's batch: whatever the pipeline yields",
    "starvecheck.loading.tap": "the user's DataLoader, the iterator it makes and its batches",
    "starvecheck.loop.trainers.hf": "transformers' TrainingArguments, state and control",
    "starvecheck.loop.trainers.pl": "Lightning's Trainer, module, batch and outputs",
}


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def seams() -> dict[str, set[str]]:
    """Each module's names another layer imports (the package root is the public API,
    the user's side, not a layer)."""
    used: dict[str, set[str]] = defaultdict(set)
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
        if len(parts) < 2:
            continue
        importer = ".".join(parts)
        for n in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("starvecheck.")
                and _layer(n.module or "") != _layer(importer)
            ):
                used[n.module or ""] |= {a.name for a in n.names}
    return used


def _any_in(node: ast.AST) -> bool:
    return any(isinstance(x, ast.Name) and x.id == "Any" for x in ast.walk(node))


def any_at_seams() -> list[str]:
    found = []
    for module, names in sorted(seams().items()):
        path = SRC.parent / (module.replace(".", "/") + ".py")
        if not path.exists() or module in OUTSIDE:
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name not in names:
                continue
            members = [node] if isinstance(node, ast.FunctionDef) else node.body
            for m in members:
                if isinstance(m, ast.FunctionDef) and not m.name.startswith("_"):
                    typed = [a.annotation for a in (*m.args.args, *m.args.kwonlyargs)]
                    typed += [m.args.vararg and m.args.vararg.annotation]
                    typed += [m.args.kwarg and m.args.kwarg.annotation, m.returns]
                    if any(t is not None and _any_in(t) for t in typed):
                        found.append(f"{module}.{node.name}" + ("" if m is node else f".{m.name}"))
                elif isinstance(m, ast.AnnAssign) and _any_in(m.annotation):
                    found.append(f"{module}.{node.name}.{ast.unparse(m.target)}")
    return found


def test_the_seam_scan_sees_an_any():
    assert "starvecheck.inputs.fingerprints.leading" in {
        f"{m}.{n}" for m, ns in seams().items() for n in ns
    }


def test_no_any_where_one_layer_hands_a_value_to_another():
    """What crosses from one layer to another is typed: JSON as core/jsonvalue's
    JsonValue, a user's or a library's object as what it is, never `Any` (OUTSIDE
    names the seams whose values come from outside starvecheck)."""
    assert any_at_seams() == []


def test_a_title_more_than_one_rule_gives_is_worded_in_the_catalogue_alone():
    """profile.data-bound comes from profile's sweep and from a step breakdown: its
    titles are the catalogue's templates, and no rule spells their words again."""
    from starvecheck.core.catalogue import CATALOGUE

    shared = [k for k in CATALOGUE.values() if k.titles]
    assert shared, "the scan has something to check"
    pieces = {  # each template's longest fixed words, where they say something of their own
        max(re.split(r"\{[^}]*\}", template), key=len)
        for k in shared
        for template in k.titles.values()
    }
    spelled = {
        str(p.relative_to(SRC)): sorted(
            piece
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            for piece in pieces
            if len(piece) >= 20 and piece in n.value
        )
        for p in _modules()
        if p.name != "catalogue.py"
    }
    assert {k: v for k, v in spelled.items() if v} == {}
    fed = CATALOGUE["profile.data-bound"].title("fed", share=0.05, where="")
    assert fed == "The training step is fed: 5.0% of it waits for data"
