"""`starvecheck attach PID` on real loops where the evidence is not the main thread's
DataLoader: a starved loop run in a thread (as Ray Train runs `train_func`), a
nanoGPT-style loop with its own memmap `get_batch`, a job SIGSTOPped and a job killed
while attach reads it. Each share is set beside the loop's own clock (within its
interval), and what cannot be judged is said, never `Passed`. Each under about 40 s
(--duration 6)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from tests.loops.loopstate import attach_beside, own_share, read_state, stop_tree

LOOPS = Path(__file__).parent / "loops"
SECONDS = 6


def started(cmd: list[str], path: Path) -> subprocess.Popen:
    p = subprocess.Popen(cmd, start_new_session=True)
    deadline = time.time() + 90
    while not path.exists():
        assert p.poll() is None, "the loop exited"
        assert time.time() < deadline, "the loop never started"
        time.sleep(0.1)
    time.sleep(1.0)
    return p


def attach_cmd(pid: int) -> list[str]:
    return [sys.executable, "-m", "starvecheck", "attach", str(pid), "--json", "-",
            "--duration", str(SECONDS)]  # fmt: skip


def stage_of(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)["stages"][0]


def findings(stage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["id"]: f for f in stage["findings"]}


def data_metric(stage: dict[str, Any], pid: int) -> dict[str, Any]:
    for m in stage["metrics"]:
        lab = m["labels"]
        if lab.get("pid") == pid and lab.get("quantity") == "main_share" and lab["kind"] == "data":
            return m
    raise AssertionError("no data share")


def beside_its_own(stage: dict[str, Any], pid: int, own: float) -> None:
    """The loop's own share inside attach's 95% interval, give or take 0.03 (the loop's
    clock and the sampler's window start and end a few tens of ms apart)."""
    m = data_metric(stage, pid)
    low, high = m["labels"]["low95"], m["labels"]["high95"]
    assert low - 0.03 <= own <= high + 0.03, (m["value"], low, high, own)


def read(cmd: list[str], path: Path) -> tuple[dict[str, Any], float, int]:
    p = started(cmd, path)
    try:
        r, (a,), (b,) = attach_beside(attach_cmd(p.pid), [path], timeout=120)
        assert p.poll() is None, "the loop died under attach"
    finally:
        stop_tree(p)
    return stage_of(r), own_share(a, b), p.pid


@pytest.mark.accuracy
def test_a_starved_loop_in_a_thread_is_read_in_that_thread(tmp_path):
    path = tmp_path / "state.json"
    stage, own, pid = read([sys.executable, str(LOOPS / "attach_loop.py"), "thread", str(path)],
                           path)  # fmt: skip
    (rank,) = stage["parameters"]["ranks"]
    assert rank["thread"] == "train" and rank["loop_found"], rank
    f = findings(stage)["attach.data-wait"]
    assert f["severity"] in ("warning", "critical"), f
    assert "'train'" in f["evidence"]
    beside_its_own(stage, pid, own)


@pytest.mark.accuracy
def test_a_nanogpt_style_get_batch_is_its_wait_for_data(tmp_path):
    tokens = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 256, 1_000_000).astype(np.uint16).tofile(tokens)
    path = tmp_path / "state.json"
    cmd = [sys.executable, str(LOOPS / "nanogpt_loop.py"), str(tokens), str(path)]
    stage, own, pid = read(cmd, path)
    (rank,) = stage["parameters"]["ranks"]
    assert rank["data_path"].startswith("get_batch (nanogpt_loop.py)"), rank
    f = findings(stage)["attach.data-wait"]
    assert f["severity"] in ("warning", "critical"), f
    assert "get_batch" in f["evidence"]
    beside_its_own(stage, pid, own)


def attach_while(pid: int, act, at_s: float) -> subprocess.CompletedProcess[str]:
    """attach run on `pid`, `act()` called `at_s` seconds after its sampler starts."""
    cmd = attach_cmd(pid)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            if any("py-spy" in k.name() for k in psutil.Process(proc.pid).children()):
                break
        time.sleep(0.05)
    time.sleep(at_s)
    act()
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
def test_a_job_stopped_in_the_window_is_said_and_not_judged(tmp_path):
    path = tmp_path / "state.json"
    p = started([sys.executable, str(LOOPS / "attach_loop.py"), "data", str(path)], path)
    try:
        r = attach_while(p.pid, lambda: os.kill(p.pid, signal.SIGSTOP), 2.0)
    finally:
        os.kill(p.pid, signal.SIGCONT)  # never leave it stopped
    try:
        before = read_state(path)["steps"]
        # A step is about 45 ms; polled with a long deadline, not one fixed sleep, so that
        # a loaded machine's scheduling delay does not read as a loop left stopped.
        deadline = time.time() + 60
        while read_state(path)["steps"] <= before and time.time() < deadline:
            time.sleep(0.1)
        assert read_state(path)["steps"] > before, "the loop did not run on after SIGCONT"
    finally:
        stop_tree(p)
    stage = stage_of(r)
    said = " ".join(stage["caveats"])  # the JSON keeps each caveat's sentence
    assert "was stopped (State T" in said, said
    f = findings(stage)
    assert f["attach.data-wait"]["severity"] == "info", f["attach.data-wait"]
    assert "stopped" in f["attach.data-wait"]["title"]
    assert "attach.loader-bound" not in f


@pytest.mark.slow
def test_a_job_killed_in_the_window_is_said_and_given_no_worker_count(tmp_path):
    path = tmp_path / "state.json"
    p = started([sys.executable, str(LOOPS / "attach_loop.py"), "data", str(path)], path)
    try:
        r = attach_while(p.pid, lambda: os.kill(p.pid, signal.SIGKILL), 3.0)
    finally:
        stop_tree(p)
    stage = stage_of(r)
    said = " ".join(stage["caveats"])
    assert " exited " in said and "no worker count is predicted" in said, said
    assert "attach.loader-bound" not in findings(stage)


@pytest.mark.slow
def test_a_job_that_execs_in_the_window_is_said(tmp_path):
    path = tmp_path / "state.json"
    p = started([sys.executable, str(LOOPS / "attach_loop.py"), "exec", str(path)], path)
    try:
        r = attach_while(p.pid, lambda: os.kill(p.pid, signal.SIGUSR1), 3.0)
    finally:
        stop_tree(p)
    stage = stage_of(r)
    said = " ".join(stage["caveats"])
    assert "exec'd" in said or "changed command" in said, said
    f = findings(stage)
    assert f["attach.data-wait"]["severity"] != "ok", f["attach.data-wait"]
    assert "attach.loader-bound" not in f


@pytest.mark.slow
def test_workers_of_several_epochs_in_one_window_are_not_added_up(tmp_path):
    path = tmp_path / "state.json"
    p = started([sys.executable, str(LOOPS / "attach_loop.py"), "epochs", str(path)], path)
    try:
        r = attach_while(p.pid, lambda: None, 0.0)
    finally:
        stop_tree(p)
    stage = stage_of(r)
    (rank,) = stage["parameters"]["ranks"]
    assert len(rank["workers"]) >= 2, rank  # the window crossed an epoch's end
    found = [m for m in stage["metrics"] if m["labels"].get("quantity") == "workers_found"]
    assert [m["value"] for m in found] == [1], found  # num_workers=1: one at a time
    assert "attach.worker-memory" not in findings(stage)
