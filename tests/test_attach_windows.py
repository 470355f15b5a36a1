"""`attach PID --every SECONDS --prometheus PORT` (cli/windows.py, loop/windows.py):
each window's sampled share added to the families watch exports, the options' checks,
and a real sidecar run on a live loop, scraped, ending with the job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from starvecheck.advice.report import build_report
from starvecheck.core.context import Context
from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.loop.windows import Windows
from tests.conftest import run
from tests.loops.loopstate import stop_tree

LOOP = Path(__file__).parent / "loops" / "attach_loop.py"


def window(shares: dict[int, float], samples: int = 400, seconds: float = 10.0):
    """attach's report of one window: rank r (PID 100 + r) waits `shares[r]` of its
    samples."""
    metrics = []
    for r, share in shares.items():
        lab = {"rank": r, "pid": 100 + r}
        metrics += [
            Metric.single("attach.main.samples", samples, "samples",
                          {"quantity": "samples", **lab}),
            Metric.single("attach.main.data", share, "share",
                          {"quantity": "main_share", "kind": "data", **lab}),
        ]  # fmt: skip
    params = {
        "seconds": seconds,
        "ranks": [{"pid": 100 + r, "rank": r, "command": "python train.py"} for r in shares],
    }
    result = StageResult("attach", params, tuple(metrics))
    return build_report("attach", None, [result], Context())


def families(w: Windows) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in w.collect():
        for s in f.samples:
            out.setdefault(s.name, {})[s.labels.get("rank")] = s.value
    return out


def test_each_window_adds_its_share_of_its_seconds():
    w = Windows({"STARVECHECK_JOB": "llama"})
    w.add(window({0: 0.1, 1: 0.5}))
    w.add(window({0: 0.3, 1: 0.5}, seconds=5.0))
    f = families(w)
    assert f["starvecheck_data_wait_seconds_total"] == pytest.approx({"0": 2.5, "1": 7.5})
    assert f["starvecheck_step_seconds_total"] == pytest.approx({"0": 15.0, "1": 15.0})
    assert f["starvecheck_attach_windows_total"] == {"0": 2, "1": 2}
    assert f["starvecheck_data_wait_ratio"] == pytest.approx({"0": 0.3, "1": 0.5})
    low, high = (
        f["starvecheck_data_wait_ratio_low"]["1"],
        f["starvecheck_data_wait_ratio_high"]["1"],
    )
    assert low < 0.5 < high and high - low < 0.11  # 400 samples' Wilson interval
    links = {s.labels["rank"]: s.labels["link"] for s in next(
        x for x in w.collect() if x.name == "starvecheck_weakest_link").samples}  # fmt: skip
    assert links == {"0": "data loading", "1": "data loading"}
    labels = next(x for x in w.collect()).samples[0].labels
    assert labels["job"] == "llama" and labels["pid"] in ("100", "101") and "Hostname" in labels


def test_a_rank_not_sampled_in_a_window_adds_nothing():
    w = Windows({})
    w.add(window({0: 0.2}, samples=0))
    assert families(w) == {}
    w.add(window({0: 0.2}))
    assert families(w)["starvecheck_attach_samples_total"] == {"0": 400}
    assert next(x for x in w.collect()).samples[0].labels["job"] == "train"  # its script


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prometheus", "9400"], "--prometheus needs --every SECONDS"),
        (["--every", "2", "--duration", "5"], "--duration 5 is longer than --every 2"),
        (["--every", "0.5"], "0.5: expected from 1 to 86,400"),
        (["--every", "5", "--prometheus", "70000"], "70000 is not in the range"),
    ],
)
def test_bad_window_options_are_one_line_and_exit_2(args, message):
    r = run("attach", str(os.getpid()), *args)
    assert r.exit_code == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def scrape(port: int) -> dict[str, dict]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[s.labels.get("pid")] = s.value
    return out


@pytest.mark.slow
def test_a_sidecar_serves_a_window_every_period_until_the_job_ends(tmp_path):
    state = tmp_path / "state.json"
    loop = subprocess.Popen([sys.executable, str(LOOP), "data", str(state)], start_new_session=True)
    side = None
    try:
        deadline = time.time() + 90
        while not state.exists():
            assert loop.poll() is None and time.time() < deadline, "the loop never started"
            time.sleep(0.1)
        last = str(tmp_path / "last.json")
        cmd = [sys.executable, "-m", "starvecheck", "attach", str(loop.pid), "--every", "3",
               "--duration", "2", "--prometheus", "0", "--json", last]  # fmt: skip
        side = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
        assert side.stderr is not None
        first = side.stderr.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+)/metrics", first).group(1))
        lines = [side.stderr.readline() for _ in range(2)]  # two windows read
        assert all("starvecheck: attach window" in x for x in lines), lines
        got = scrape(port)
        pid = str(loop.pid)
        assert got["starvecheck_attach_windows_total"][pid] >= 2
        assert got["starvecheck_step_seconds_total"][pid] >= 4.0
        share = got["starvecheck_data_wait_ratio"][pid]
        assert 0 < got["starvecheck_data_wait_seconds_total"][pid] <= got[
            "starvecheck_step_seconds_total"][pid]  # fmt: skip
        assert 0.0 <= share <= 1.0
        stop_tree(loop)  # the job ends: the sidecar ends with the last window's report
        _, err = side.communicate(timeout=60)
        assert side.returncode in (0, 1), err
        assert (tmp_path / "last.json").stat().st_size > 0
        assert "Traceback" not in err
    finally:
        stop_tree(loop)
        if side is not None and side.poll() is None:
            side.kill()
            side.wait()
