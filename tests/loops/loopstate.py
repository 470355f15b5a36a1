"""What tests/loops/attach_loop.py writes after every step, and how its readers (the
tests and benchmarks that set attach beside the loop's own clock) read it back: the
loop's totals (seconds waiting for data, seconds in all, steps), written whole by a
rename, and the data-wait share attach reported for a process; and how a loop is
stopped, its whole tree. No torch here: readers need not import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
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


def advised_workers(
    findings: list[dict[str, Any]], ids: tuple[str, ...]
) -> tuple[int | None, float | None, str]:
    """The num_workers a report's findings (those of `ids`) recommend, its predicted
    gain and the finding's title; where none gives a count, (None, None, what they
    said instead, each title once)."""
    for f in findings:
        if f["id"] in ids and (f.get("fix") or {}).get("num_workers") is not None:
            return int(f["fix"]["num_workers"]), (f.get("gain") or {}).get("value"), f["title"]
    said = dict.fromkeys(f"{f['id']}: {f['title']}" for f in findings if f["id"] in ids)
    return None, None, "; ".join(said) or "no change advised"


def stop_tree(p: subprocess.Popen[Any]) -> None:
    """Kill the loop and everything under it. torchrun starts each rank in a session of
    its own, so killing the agent's process group leaves the ranks running (two of them
    burned the CPUs through the rest of a test run); the tree is read first, then each
    process killed, deepest first."""
    import psutil

    try:
        tree = psutil.Process(p.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    for child in reversed(tree):
        with contextlib.suppress(psutil.Error):
            child.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    psutil.wait_procs(tree, timeout=10)


def attach_beside(
    cmd: list[str],
    paths: list[Path],
    timeout: float = 300.0,
    window: list[float] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, float]], list[dict[str, float]]]:
    """Run `starvecheck attach` (`cmd`) and read the loops' totals (`paths`) when its
    sampler starts and when it ends (its py-spy child appears, then goes), so that the
    loop's own share is taken over the seconds attach sampled, not attach's start-up
    (imports, the machine's facts), which costs a 2-CPU machine's loops CPU too.
    (the run, the totals at the start, at the end). `window`, where given, gets the
    wall-clock times (time.time()) the sampler was seen to start and end: a loop whose
    steps are long reads its own clock over exactly those seconds (its totals are only
    written once a step)."""
    import psutil

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    before: list[dict[str, float]] = []
    after: list[dict[str, float]] = []
    deadline = time.time() + timeout
    # attach restarts its py-spys once, slower, where they took more than its budget,
    # and drops what the first ones sampled: where every py-spy of the first start is
    # gone and new ones run, the window starts again with them.
    first: set[int] = set()
    while proc.poll() is None and time.time() < deadline:
        try:
            kids = psutil.Process(proc.pid).children(recursive=True)  # nsenter: a grandchild
            spies = {k.pid for k in kids if "py-spy" in k.name()}
        except psutil.Error:
            spies = set()
        sampling = bool(spies)
        if sampling and not before:
            if window is not None:
                window.append(time.time())
            before = [read_state(p) for p in paths]
            first = spies
        elif sampling and before and not after and not spies & first:
            if window is not None:
                window[0] = time.time()
            before = [read_state(p) for p in paths]
            first = spies
        elif before and not after and not sampling:
            if window is not None:
                window.append(time.time())
            after = [read_state(p) for p in paths]
        # Every 0.1 s: this loop is another process beside the job while attach reads
        # it (its CPU counts in attach's others), at 20 ms it took 0.1-0.15 CPUs.
        time.sleep(0.1)
    out, err = proc.communicate(timeout=max(1.0, deadline - time.time()))
    if not before or not after:
        raise RuntimeError(f"attach's sampler was never seen to start and end: {err.strip()}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), before, after
