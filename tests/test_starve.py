"""`starve`: the models, the recommendation, the advice, the sweep table, and the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from starvecheck.advice.results import Results
from starvecheck.advice.starve import complete, recommended, rules
from starvecheck.core.metric import Metric
from starvecheck.core.model import Severity, StageResult
from starvecheck.inputs import embedded
from starvecheck.render import sweep
from starvecheck.stages.starve.model import Plan, predicted_wait_ms, sleep_model_wait_ms
from starvecheck.stages.starve.stage import summarize
from starvecheck.stages.starve.sweep import Point, burn_cpu, capacity_workers
from tests.conftest import run, tiny_tokenizer


def advise(metrics, params):
    """starve's rules over one result, as judging runs them."""
    return rules(Results({"starve": StageResult("starve", params, tuple(metrics))}))


# Fast settings for end-to-end runs: 1 ms per sample, batches of 4, a 5 ms step.
FAST = ["--sample-ms", "1", "--batch-size", "4", "--step-ms", "5", "--steps", "3"]


def test_models_reproduce_the_known_case():
    # D = 5 ms, B = 32, G = 50 ms: num_workers=0 makes every batch between steps.
    w0 = predicted_wait_ms(5, 32, 50, 0, cpus=2)
    assert w0 == 160
    assert w0 / (w0 + 50) == pytest.approx(0.7619, abs=1e-4)  # the "about 76%"
    assert predicted_wait_ms(5, 32, 50, 1, cpus=2) == 110
    assert predicted_wait_ms(5, 32, 50, 2, cpus=2) == 30
    # Four workers on two CPUs are no faster than two; a sleep model says they are.
    assert predicted_wait_ms(5, 32, 50, 4, cpus=2) == 30
    assert sleep_model_wait_ms(5, 32, 50, 4) == 0
    assert sleep_model_wait_ms(5, 32, 50, 2) == 30
    assert predicted_wait_ms(5, 32, 50, 8, cpus=16) == 0


def test_burn_cpu_spends_cpu_time_not_wall_time():
    t0 = time.thread_time()
    burn_cpu(30)
    assert time.thread_time() - t0 >= 0.030


def _point(w: int, wait: float, compute: float = 50.0, first: float = 0.2) -> Point:
    return Point(w, [wait] * 4, [compute] * 4, first)


def _recommended(points: list[Point], effective_cpus: int) -> int | None:
    """advice's recommendation from the stage's result of this sweep."""
    metrics, params = _metrics(points, cpus=effective_cpus)
    return recommended(StageResult("starve", params, tuple(metrics)))


def test_idle_share_and_recommendation():
    points = [_point(0, 160), _point(1, 110), _point(2, 30), _point(4, 29.5)]
    assert points[0].idle_share == pytest.approx(160 / 210)
    # 4 workers are barely better, and above the 2 CPUs: 2 is recommended.
    assert _recommended(points, effective_cpus=2) == 2
    # With 8 CPUs, 4 is eligible but within 2 points of 2: the fewer wins.
    assert _recommended(points, effective_cpus=8) == 2
    fed = [_point(0, 160), _point(2, 0.0), _point(4, 0.0)]
    assert _recommended(fed, effective_cpus=4) == 2
    assert _recommended([_point(4, 0)], effective_cpus=2) is None
    # The stage measures its capacity where advice recommends (at most the CPUs).
    assert capacity_workers(points, effective_cpus=2) == 2
    assert capacity_workers([_point(4, 0)], effective_cpus=2) == 2


def _metrics(points: list[Point], cpus: int = 2, d: float = 5.0) -> tuple[list[Metric], dict]:
    plan = Plan(
        sample_ms=d,
        batch_size=32,
        step_ms=50,
        workers=tuple(p.workers for p in points),
        effective_cpus=cpus,
    )
    return list(summarize(plan, d, points).to_metrics()), {**plan.parameters(), "sample_cpu_ms": d}


def test_summarize_names_and_values():
    metrics, _ = _metrics([_point(0, 160), _point(2, 30)])
    by = {m.name: m for m in metrics}
    for w in (0, 2):
        for stem in (
            "wait_ms",
            "predicted_wait_ms",
            "sleep_model_wait_ms",
            "compute_ms",
            "idle_share",
            "first_batch_s",
        ):
            assert f"{stem}.w{w}" in by
    assert by["idle_share.w0"].value == pytest.approx(0.7619, abs=1e-4)
    assert by["predicted_wait_ms.w2"].value == 30
    # The stage measures; the recommendation is advice's, added when the run is judged.
    assert "recommended_num_workers" not in by
    _, params = _metrics([_point(0, 160), _point(2, 30)])
    done = complete(StageResult("starve", params, tuple(metrics)))
    assert done.metrics == tuple(metrics)  # measured, untouched: the verdict is judged's
    (rec,) = done.judged.figures
    assert rec.name == "recommended_num_workers" and rec.value == 2


def test_wait_is_the_mean_not_the_median():
    # Bursty arrivals: one long wait, then short ones. The median says 0; the GPU idles.
    p = Point(2, [90.0, 0.0, 0.0], [50.0] * 3)
    metrics, _ = _metrics([p])
    wait = next(m for m in metrics if m.name == "wait_ms.w2")
    assert wait.value == pytest.approx(30.0) and wait.median == 0.0


def test_advice_when_no_worker_count_is_enough():
    metrics, params = _metrics([_point(0, 160), _point(1, 110), _point(2, 30), _point(4, 30)])
    found = {f.id: f for f in advise(metrics, params)}
    # Ranked by what the workers recover (39% of the step), not by the 76% idle at 0.
    assert found["starve.workers-zero"].severity is Severity.WARNING
    assert found["starve.workers-zero"].gain.value == pytest.approx(0.762 - 0.375, abs=0.01)
    enough = found["starve.not-enough-cpu"]
    assert enough.severity is Severity.WARNING  # 37.5% idle at best
    assert "3.2 CPUs" in enough.evidence and "2 effective" in enough.evidence
    assert found["starve.workers-above-cpus"].severity is Severity.WARNING
    assert "sleep-based model would promise 0 ms" in found["starve.workers-above-cpus"].evidence


@pytest.mark.parametrize(
    ("best_wait", "severity"),
    [(0.0, Severity.CRITICAL), (80.0, Severity.WARNING), (140.0, Severity.INFO)],
)
def test_workers_zero_ranked_by_what_workers_recover(best_wait, severity):
    # 76% idle at 0 in every case; workers recover 76%, 10+% and under 10% of the step.
    metrics, params = _metrics([_point(0, 160), _point(2, best_wait)], cpus=4)
    zero = {f.id: f for f in advise(metrics, params)}["starve.workers-zero"]
    assert zero.severity is severity


def test_advice_when_workers_feed_the_gpu():
    metrics, params = _metrics([_point(0, 160), _point(4, 0.5)], cpus=8)
    found = {f.id: f for f in advise(metrics, params)}
    assert found["starve.workers-needed"].severity is Severity.OK
    assert "num_workers=4" in found["starve.workers-needed"].evidence
    assert "starve.not-enough-cpu" not in found


def test_advice_slow_first_batch():
    metrics, params = _metrics([_point(0, 160), _point(2, 0.0, first=2.5)])
    found = {f.id: f for f in advise(metrics, params)}
    assert "persistent_workers=True" in found["starve.first-batch-slow"].recommendation


def test_sweep_table_pivots_worker_counts():
    metrics, params = _metrics([_point(0, 160), _point(2, 30)])
    metrics = list(complete(StageResult("starve", params, tuple(metrics))).figures)
    headers, rows, rest = sweep.split(tuple(metrics))
    assert headers[0] == "workers" and "GPU idle" in headers
    assert [r[0] for r in rows] == ["0", "2"]
    assert rows[0][headers.index("GPU idle")] == "76.2%"
    assert [m.name for m in rest] == ["sample_cpu_ms", "recommended_num_workers"]
    # Not a sweep: everything stays in the list.
    plain = (Metric.single("x", 1, "ms"),)
    assert sweep.split(plain) == ((), [], list(plain))


def test_starve_end_to_end_json():
    r = run("starve", *FAST, "--workers", "0,1,2", "--json", "-")
    assert r.exit_code == 0, r.stderr
    stage = r.json["stages"][0]
    names = {m["name"] for m in stage["metrics"]}
    for w in (0, 1, 2):
        assert {
            f"wait_ms.w{w}",
            f"predicted_wait_ms.w{w}",
            f"compute_ms.w{w}",
            f"idle_share.w{w}",
        } <= names
    by = {m["name"]: m for m in stage["metrics"]}
    assert 0 <= by["idle_share.w0"]["value"] <= 1
    assert by["recommended_num_workers"]["value"] <= r.json["machine"]["cpu"]["effective_cpus"]
    # W=0 waits for the whole batch's CPU work: at least B x D = 4 ms.
    assert by["wait_ms.w0"]["value"] >= 4.0


def test_sleep_mode_and_markdown():
    r = run("starve", *FAST, "--workers", "0,2", "--sleep", "--markdown", "-")
    assert r.exit_code == 0, r.stderr
    assert "| workers | wait ms (mean) |" in r.stdout
    assert "sleep instead of working" in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--workers", "x"], "--workers"),
        (["--workers", "1,,2"], "--workers"),
        (["--workers", "2000"], "--workers"),
        (["--sleep", "--tokenizer", "t"], "choose one"),
        (["--tokenizer", "/nonexistent/tok"], "never"),
        (["--plot", "/nonexistent/dir/p.png"], "--plot"),
        (["--batch-size", "0"], "batch-size"),
    ],
)
def test_usage_errors_are_one_line(args, needle):
    r = (
        run("starve", *FAST, "--workers", "0", *args)
        if "--workers" not in args
        else run("starve", *FAST, *args)
    )
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("starvecheck: error:"), r.stderr
    assert needle in lines[0]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "idle.png"
    r = run("starve", *FAST, "--workers", "0,1", "--plot", str(png), "--json", "-")
    assert r.exit_code == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_real_tokenization_is_measured_and_used(tmp_path):
    tiny_tokenizer(tmp_path / "tok")
    r = run(
        "starve",
        "--tokenizer",
        str(tmp_path / "tok"),
        "--batch-size",
        "4",
        "--step-ms",
        "5",
        "--steps",
        "3",
        "--workers",
        "0,1",
        "--json",
        "-",
    )
    assert r.exit_code == 0, r.stderr
    stage = r.json["stages"][0]
    assert stage["parameters"]["work"] == "tokenize"
    cpu_ms = next(m["value"] for m in stage["metrics"] if m["name"] == "sample_cpu_ms")
    assert 0 < cpu_ms < 100
    assert any("real tokenization" in c for c in stage["caveats"])


def test_default_texts_are_real_prose():
    texts = embedded.default_texts(5, chars=500)
    assert len(texts) == 5 and all(len(t) == 500 for t in texts)
    assert sum(t.count(" the ") for t in texts) > 5  # English, not noise


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has exited
    except OSError:
        return False


def _children(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(x) for x in f.read().split()}
    except OSError:
        return set()


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_shuts_the_workers_down(sig, code):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "starvecheck",
            "starve",
            "--workers",
            "2",
            "--steps",
            "400",
            "--json",
            "-",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 30
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < 2:
        workers = _children(proc.pid)
        time.sleep(0.05)
    assert len(workers) >= 2, "the DataLoader workers never started"
    time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    # A deadline to wait for, not a fixed 0.2 s a loaded machine can outrun; under torch's
    # own watchdog (a worker left running ends once it sees its parent gone, 5 s).
    deadline = time.monotonic() + 3
    while [w for w in workers if _alive(w)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], "workers left running"


def test_pin_memory_advice_only_with_a_gpu():
    metrics, params = _metrics([_point(0, 160), _point(2, 30)])
    assert "starve.pin-memory" not in {f.id for f in advise(metrics, params)}
    found = {f.id: f for f in advise(metrics, {**params, "cuda": True})}
    assert "pin_memory=True" in found["starve.pin-memory"].recommendation


def test_rules_and_table_select_by_labels_not_names():
    """A metric renamed but labelled the same lands in the same finding and column."""
    metrics, params = _metrics([_point(0, 160), _point(1, 110), _point(2, 30), _point(4, 30)])
    renamed = [replace(m, name=f"x{i}") for i, m in enumerate(metrics)]
    assert [f.to_dict() for f in advise(renamed, params)] == [
        f.to_dict() for f in advise(metrics, params)
    ]
    assert sweep.split(tuple(renamed))[1] == sweep.split(tuple(metrics))[1]
    unlabelled = [replace(m, labels={}) for m in metrics]
    assert advise(unlabelled, params) == [] and sweep.split(tuple(unlabelled))[1] == []


def test_every_starve_metric_is_labelled():
    r = run(
        "starve",
        "--quick",
        "--workers",
        "0,1",
        "--sample-ms",
        "1",
        "--step-ms",
        "5",
        "--steps",
        "2",
        "--json",
        "-",
    )
    (stage,) = r.json["stages"]
    assert stage["metrics"] and all(m["labels"].get("quantity") for m in stage["metrics"])
    assert {m["labels"].get("workers") for m in stage["metrics"]} >= {0, 1}
