"""A signal while torch's C++ start-up runs never aborts starvecheck.

While torch initialises its extension, C++ code (pybind11) calls back into Python
(importlib's module locks). A signal handler that raises there, as starvecheck's do
while a command runs (signals.signals_raise), throws a C++ exception through code that
cannot pass it on: `terminate called after throwing an instance of
'pybind11::error_already_set'`, SIGABRT, exit 134 and 85 lines of stack. The heavy
imports hold signals (signals.importing) and the signal is raised after them.

Two tests. One is exact: for each of torch's C++ functions that calls back into
Python during `import torch`, a run signals itself from inside that call (a profile
hook sees the Python code it calls). The other is what a person sees: SIGTERM to the
process group of `starvecheck loader --quick` at a random point of its start-up, 50
times (seed printed; STARVECHECK_IMPORT_SEED replays a run).
"""

from __future__ import annotations

import ast
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import group_alive, source_env

SRC = Path(__file__).resolve().parents[1] / "src"
LOADER = ["loader", "--quick", "--samples", "1500", "--runs", "1"]
LINE = "starvecheck: error: terminated by SIGTERM"
ABORTED = ("Fatal Python error", "pybind11", "terminate called", "Aborted", "core dumped")

# torch's C++ functions that call Python while `import torch` runs, and how often.
CALLBACKS = """
import sys
inside, found = [], {}
def profile(frame, event, arg):
    if event == "c_call" and str(getattr(arg, "__module__", "")).startswith("torch._C"):
        inside.append(arg)
    elif event in ("c_return", "c_exception") and inside and arg is inside[-1]:
        inside.pop()
    elif event == "call" and inside:
        found[inside[-1].__name__] = found.get(inside[-1].__name__, 0) + 1
sys.setprofile(profile)
import torch
sys.setprofile(None)
print(found)
"""

# starvecheck, signalled with SIGTERM from the first Python code that torch's C++
# function TARGET calls: the handler runs there, inside the C++ frame.
SIGNAL_INSIDE = """
import os, runpy, signal, sys
target = sys.argv[1]
inside = []
def profile(frame, event, arg):
    if event == "c_call" and str(getattr(arg, "__module__", "")).startswith("torch._C"):
        inside.append(arg)
    elif event in ("c_return", "c_exception") and inside and arg is inside[-1]:
        inside.pop()
    elif event == "call" and inside and inside[-1].__name__ == target:
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)
sys.argv = ["starvecheck", *sys.argv[2:]]
sys.setprofile(profile)
runpy.run_module("starvecheck", run_name="__main__")
"""


def _env(tmp: Path) -> dict[str, str]:
    # TMPDIR: multiprocessing's pymp-* land here, so what is left is this run's.
    return source_env(TMPDIR=str(tmp), STARVECHECK_DEBUG="")


def _dirs(work: Path) -> tuple[Path, Path]:
    data, tmp = work / "data", work / "tmp"
    data.mkdir(parents=True)
    tmp.mkdir()
    return data, tmp


def _left(data: Path, tmp: Path) -> list[str]:
    """What a run left: anything in its PATH; in its TMPDIR anything but torch's own
    per-user compile cache (torchinductor_<user>, which torch keeps by design)."""
    temp = [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]
    return sorted(p.name for p in data.iterdir()) + sorted(temp)


def _problems(what: str, rc: int, err: str, data: Path, tmp: Path) -> list[str]:
    lines = err.splitlines()
    out = []
    if any(a in err for a in ABORTED) or rc in (134, -signal.SIGABRT):
        out.append(f"{what}: aborted (exit {rc}): {lines[:3]!r} ... {len(lines)} lines")
    elif rc == 128 + signal.SIGTERM:
        if lines != [LINE]:
            out.append(f"{what}: exit {rc}, stderr {lines[-5:]!r}")
    elif rc == -signal.SIGTERM:
        # The default action: the signal came before starvecheck set its handlers.
        if any("Traceback" in line for line in lines):
            out.append(f"{what}: killed, with a traceback: {lines[-5:]!r}")
    elif rc != 0:  # 0: it ended before the signal came
        out.append(f"{what}: exit {rc}, stderr {lines[-5:]!r}")
    if left := _left(data, tmp):
        out.append(f"{what}: left {left}")
    return out


def _callbacks() -> list[str]:
    r = subprocess.run(
        [sys.executable, "-c", CALLBACKS], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return sorted(ast.literal_eval(r.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_a_signal_inside_torchs_cpp_start_up_is_raised_after_it(tmp_path):
    pytest.importorskip("torch")
    names = _callbacks()
    assert names, "torch's import calls no Python from C++ here: nothing to test"

    def one(name: str) -> list[str]:
        data, tmp = _dirs(tmp_path / name)
        p = subprocess.run(
            [sys.executable, "-c", SIGNAL_INSIDE, name, *LOADER, str(data)],
            cwd=data,
            env=_env(tmp),
            capture_output=True,
            text=True,
            timeout=120,
        )
        problems = _problems(f"SIGTERM inside {name}", p.returncode, p.stderr, data, tmp)
        if not problems and p.returncode != 128 + signal.SIGTERM:
            problems.append(f"SIGTERM inside {name}: exit {p.returncode}, not 143")
        return problems

    with ThreadPoolExecutor(2) as pool:
        problems = [x for found in pool.map(one, names) for x in found]
    assert not problems, f"torch's C++ functions that call Python: {names}\n" + "\n".join(problems)


# Where a heavy import needs no holding: code only a DataLoader runs (a sample, a
# collate, a batch), where torch is loaded already and the import is a dict lookup;
# holding there would swap three signal handlers for every sample.
HEAVY = ("torch", "transformers", "streaming", "matplotlib", "pyarrow")
UNHELD = {
    "stages/samples/datasets.py::_tensor": "a sample's bytes as a tensor",
    "stages/samples/datasets.py::TextSamples.__getitem__": "a sample",
    "stages/samples/datasets.py::stack_tokens": "a collate",
    "stages/samples/datasets.py::collate_flat": "a collate",
    "stages/profile/loop.py::collate_tokens": "a collate",
    "stages/starve/sweep.py::_Samples.__getitem__": "a sample",
    "stages/loader/factory/configuration.py::_Reading._batch": "a batch",
}


def _heavy_imports(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(qualified function, line, held) of each import of a heavy library; held: inside
    `with importing(LIBRARY)`, LIBRARY the library imported (surroundings.check reads
    what that library needs before it loads)."""
    found = []

    def named(item: ast.withitem) -> str | None:
        call = item.context_expr
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "importing":
            arg = call.args[0] if call.args else None
            return arg.value if isinstance(arg, ast.Constant) else "?"
        return None

    def walk(node: ast.AST, where: list[str], held: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner, hold = where, held
            if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                continue  # for the type checker alone: never runs
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = [*where, child.name]
            if isinstance(child, ast.With):
                hold = held or next((n for n in map(named, child.items) if n), None)
            if isinstance(child, ast.Import | ast.ImportFrom):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else []
                if isinstance(child, ast.ImportFrom) and child.level == 0:
                    names = [child.module or ""]
                tops = {n.split(".")[0] for n in names} & set(HEAVY)
                if tops:
                    found.append((".".join(where), child.lineno, hold in tops))
            walk(child, inner, hold)

    walk(tree, [], None)
    return found


def test_an_import_for_the_type_checker_alone_is_no_import():
    code = "if TYPE_CHECKING:\n    import torch\nimport transformers\n"
    assert _heavy_imports(ast.parse(code)) == [("", 3, False)]


def test_importing_names_the_library_it_holds_for():
    """`with importing("torch")` around `import torch` holds; around another library's
    import it does not (the checks before the import would be the wrong library's)."""
    held = 'with importing("torch"):\n    import torch\n'
    wrong = 'with importing("torch"):\n    import pyarrow\n'
    code = held + wrong
    assert _heavy_imports(ast.parse(code)) == [("", 2, True), ("", 4, False)]


def test_every_heavy_import_of_the_command_line_holds_signals():
    """Each import of torch, transformers, streaming, matplotlib or pyarrow that a
    command runs is inside `with signals.importing(LIBRARY)`, but where a DataLoader alone
    runs it (UNHELD). loop/ runs in the user's own process, on the user's handlers,
    and imports torch only where the user's loop has it loaded: not checked."""
    root = SRC / "starvecheck"
    bare, unheld_seen = [], set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("loop/"):
            continue
        for where, line, held in _heavy_imports(ast.parse(path.read_text())):
            key = f"{rel}::{where}"
            if key in UNHELD:
                unheld_seen.add(key)
            elif not held:
                bare.append(f"{rel}:{line} ({where or 'module level'})")
    assert not bare, "heavy imports outside `with importing(LIBRARY)`:\n" + "\n".join(bare)
    assert unheld_seen == set(UNHELD), f"no longer there: {set(UNHELD) - unheld_seen}"


RUNS = 50
AT_ONCE = 3
EXIT_TIMEOUT_S = 60


@pytest.mark.slow
def test_sigterm_to_the_process_group_during_start_up_never_aborts(tmp_path):
    pytest.importorskip("torch")
    seed = int(os.environ.get("STARVECHECK_IMPORT_SEED") or random.SystemRandom().randrange(10**6))
    print(f"STARVECHECK_IMPORT_SEED={seed}")
    rng = random.Random(seed)
    delays = [rng.uniform(0.05, 1.5) for _ in range(RUNS)]

    def one(i: int) -> list[str]:
        data, tmp = _dirs(tmp_path / str(i))
        p = subprocess.Popen(
            [sys.executable, "-m", "starvecheck", *LOADER, str(data)],
            cwd=data,
            env=_env(tmp),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, as a shell's job is
        )
        time.sleep(delays[i])
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        what = f"run {i}, SIGTERM after {delays[i]:.2f} s"
        try:
            _, err = p.communicate(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return [f"{what}: still running after {EXIT_TIMEOUT_S} s"]
        deadline = time.monotonic() + 10
        while group_alive(p.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        problems = _problems(what, p.returncode, err.decode(errors="replace"), data, tmp)
        if left := group_alive(p.pid):
            problems.append(f"{what}: processes of its group still run: {left}")
        return problems

    with ThreadPoolExecutor(AT_ONCE) as pool:
        problems = [x for found in pool.map(one, range(RUNS)) for x in found]
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)
