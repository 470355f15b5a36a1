"""`starvecheck attach` run with another py-spy, as a process of its own (so that a
test can time it, signal it and look for what it left running):

    python attach_with_spy.py PY_SPY attach PID ...
"""

from __future__ import annotations

import sys

from starvecheck.stages.attach import spy

if __name__ == "__main__":
    binary = sys.argv.pop(1)
    spy.py_spy = lambda: binary
    from starvecheck import entry

    raise SystemExit(entry())
