"""What tests/loops/attach_loop.py writes after every step, and how its readers (the
tests and benchmarks that set attach beside the loop's own clock) read it back: the
loop's totals (seconds waiting for data, seconds in all, steps), written whole by a
rename, and the data-wait share attach reported for a process. No torch here: readers
need not import it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def write_state(path: str, waited: float, total: float, steps: int) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({"waited": waited, "total": total, "steps": steps, "at": time.time()}, f)
    os.replace(path + ".tmp", path)


def read_state(path: Path, tries: int = 100) -> dict[str, float]:
    """The loop's totals; RuntimeError where none could be read in `tries` x 50 ms."""
    for _ in range(tries):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"{path} never written")


def own_share(before: dict[str, float], after: dict[str, float]) -> float:
    """The loop's own data-wait share between two readings."""
    return (after["waited"] - before["waited"]) / (after["total"] - before["total"])


def data_share(stage: dict[str, Any], pid: int) -> float:
    """The share of `pid`'s main thread waiting for data, as attach's JSON has it."""
    for m in stage["metrics"]:
        labels = m["labels"]
        mine = labels.get("pid") == pid and labels.get("kind") == "data"
        if mine and labels.get("quantity") == "main_share":
            return float(m["value"])
    return 0.0
