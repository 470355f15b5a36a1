"""docs/development.md's tree of the package is the map people read first: it names
every folder and module under src/starvecheck/, and nothing that is not there.

The tree is the first fenced block under its "The package" heading: one entry a line,
two spaces of indent a level, a folder written with its trailing `/`, then what it
holds. A module added without a line there, or a line left behind by a move, fails
here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "starvecheck"
DOC = ROOT / "docs" / "development.md"


def tree_block(text: str) -> list[str]:
    """The lines of the first fenced block after the heading `## The package`."""
    after = text.split("\n## The package", 1)[1]
    block = after.split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


def named(lines: list[str]) -> set[str]:
    """Every path the tree names, relative to src/starvecheck/ (folders end in `/`).
    Lines deeper than an entry are its description's continuation or its children:
    a child is a line whose first word ends in `.py` or `/` at one level deeper."""
    root = lines[0].strip()
    assert root == "src/starvecheck/", root
    out: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in lines[1:]:
        indent = len(line) - len(line.lstrip(" "))
        word = line.split()[0]
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.py|/)", word):
            continue  # a description's continuation
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + word
        out.add(path)
        if word.endswith("/"):
            stack.append((indent, path))
    return out


def holds_code(path: Path) -> bool:
    """More than a docstring: a package's __init__.py that defines or hands on names."""
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def on_disk() -> set[str]:
    """Every module and folder of the package, as the tree names them: a folder by
    its own line, its `__init__.py` only where it holds code."""
    out: set[str] = set()
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC)
        if rel.name == "__init__.py" and len(rel.parts) > 1 and not holds_code(p):
            continue
        out.add(rel.as_posix())
        for parent in rel.parents:
            if parent != Path("."):
                out.add(parent.as_posix() + "/")
    return out


def test_the_tree_reads_nested_entries():
    lines = [
        "src/starvecheck/",
        "  a.py        what a is",
        "              and more of it",
        "  b/          a folder",
        "    c.py      in b",
        "    d/",
        "      e.py",
        "  f.py",
    ]
    assert named(lines) == {"a.py", "b/", "b/c.py", "b/d/", "b/d/e.py", "f.py"}


def test_development_md_names_every_module_and_nothing_else():
    listed = named(tree_block(DOC.read_text()))
    present = on_disk()
    assert len(present) > 100  # the walk sees the package
    assert sorted(present - listed) == [], "modules missing from docs/development.md"
    assert sorted(listed - present) == [], "docs/development.md names what is not there"
