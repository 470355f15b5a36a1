"""A Ctrl-C while the console script imports the CLI ends the run, even where Python
loses it: a KeyboardInterrupt raised inside a finalizer (a `__del__`, a gc callback) is
printed as "Exception ignored" and dropped, and the run would go on to measure and print
a report (seen once in the slow lane: `io` answered in full after a SIGINT at 0.05 s).
`starvecheck.entry` counts the signal itself and ends with its one line and 130."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# SIGINT delivered inside a finalizer run while `starvecheck.cli` is being found: the
# handler runs at the finalizer's next bytecode, so its KeyboardInterrupt is unraisable.
SWALLOWED = """
import importlib.abc, os, signal, sys

class Bomb:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10000):
            pass

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "starvecheck.cli":
            sys.meta_path.remove(self)
            Bomb()
        return None

import starvecheck
sys.meta_path.insert(0, Finder())
sys.argv = ["starvecheck", "env", "--json", "-"]
rc = starvecheck.entry()
print("RC", rc)
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("STARVECHECK_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )


def test_an_interrupt_python_swallows_while_the_cli_imports_still_ends_the_run():
    done = run(SWALLOWED)
    assert done.stdout == "RC 130\n", (done.stdout[:300], done.stderr)
    assert done.stderr == "starvecheck: error: interrupted\n"


def test_without_an_interrupt_the_import_hands_sigint_back_as_python_had_it():
    code = (
        "import signal, sys, starvecheck\n"
        "sys.argv = ['starvecheck', '--version']\n"
        "rc = starvecheck.entry()\n"
        "print('RC', rc, signal.getsignal(signal.SIGINT) is signal.default_int_handler,"
        " sys.unraisablehook is sys.__unraisablehook__)\n"
    )
    done = run(code)
    assert done.stdout.splitlines()[-1] == "RC 0 True True", done.stderr
