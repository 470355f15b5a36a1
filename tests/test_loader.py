"""`loader`: the knee and the steady-state window, the advice, the table, the Streaming
import helper and its cleanup, and the command end to end: generated data, the user's
files, a missing extra, usage errors, and an interrupt that leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from starvecheck.advice.loader import complete, dataloader_line, rules
from starvecheck.advice.results import Results
from starvecheck.core.criteria import knee
from starvecheck.core.figures import headline
from starvecheck.core.figures import loader_curves as curves
from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.model import Severity, StageResult
from starvecheck.render import loader as loader_render
from starvecheck.render.sections import stage_sections
from starvecheck.scratch.directory import Scratch
from starvecheck.stages.loader.epochs import steady
from starvecheck.stages.samples import mds, sources
from starvecheck.stages.samples.plan import Plan
from tests.conftest import alive, children, run, settled
from tests.fixtures.labels.loader import labels as loader_labels


def _labelled(m: Metric) -> Metric:
    return m.labelled(**loader_labels(m.name, m.unit))


def advise(metrics, params):
    """loader's rules over one result, as advice.judge runs them."""
    return rules(Results({"loader": StageResult("loader", params, tuple(metrics))}))


def table(metrics, params):
    """loader's table of these figures, as render/sections asks for it."""
    return loader_render.split(StageResult("loader", params, tuple(metrics)), list(metrics))


# Small enough that a whole sweep takes a few seconds here.
SMALL = ["--quick", "--samples", "256", "--sample-size", "4K", "--batch-size", "16"]
STREAMING_SHM = re.compile(r"\d{6}_[a-z_]+")
STREAMING_LOCK = re.compile(r"\d{6}_(barrier|cache)_filelock")


def streaming_leftovers() -> set[str]:
    """Names Streaming creates: shared memory in /dev/shm, lock files in the temp dir."""
    shm = {n for n in os.listdir("/dev/shm") if STREAMING_SHM.fullmatch(n)}
    locks = {n for n in os.listdir(tempfile.gettempdir()) if STREAMING_LOCK.fullmatch(n)}
    return shm | locks


# --- the knee, the window, the curves (pure) ---------------------------------------------


def test_knee_is_the_fewest_workers_within_5_percent_of_the_best():
    assert knee({0: 100, 1: 180, 2: 200, 4: 210}, effective_cpus=2) == 2
    # A plateau: one worker already reaches 98% of the best.
    assert knee({0: 100, 1: 196, 2: 200}, effective_cpus=2) == 1
    # Exactly 95% counts.
    assert knee({0: 95, 1: 100}, effective_cpus=4) == 0
    # Nothing helps: zero workers.
    assert knee({0: 1000, 1: 400, 2: 600}, effective_cpus=2) == 0


def test_knee_never_goes_above_the_effective_cpus():
    # 8 workers are best, but this machine has 2 CPUs: the best at or below 2 decides.
    assert knee({0: 100, 2: 150, 8: 400}, effective_cpus=2) == 2
    assert knee({0: 100, 1: 150, 2: 300}, effective_cpus=1) == 1
    assert knee({4: 100, 8: 200}, effective_cpus=2) is None


def test_steady_window_skips_the_start_up_queue():
    arrivals = [1.0 + 0.1 * k for k in range(20)]  # 20 batches, 0.1 s apart after 1 s
    # 2 workers x prefetch 2: the first 5 batches were queued during start-up.
    skip, seconds = steady(0.0, arrivals, workers=2, prefetch=2)
    assert skip == 5 and seconds == pytest.approx(arrivals[-1] - arrivals[4])
    # In-process loading: only the first batch is left out.
    assert steady(0.0, arrivals, workers=0, prefetch=2)[0] == 1
    # A short epoch keeps its second half; one batch counts from the start.
    assert steady(0.0, arrivals[:6], workers=8, prefetch=2)[0] == 3
    assert steady(0.0, [0.5], workers=2, prefetch=2) == (0, 0.5)


def _rate(layout: str, temp: str, w: int, v: float | None) -> Metric:
    name = f"throughput.{layout}.{temp}.w{w}"
    labels = loader_labels(name, "samples/s")
    if v is None:
        return Metric.missing(name, "samples/s", "not cold", labels)
    return Metric(name, v, "", labels=labels)


def test_curves_judge_cold_where_every_cold_point_exists():
    metrics = [
        _rate("shard", "cold", 0, 100),
        _rate("shard", "cold", 2, 300),
        _rate("shard", "warm", 0, 900),
        _rate("mds", "cold", 0, None),  # withheld: the cache was not cold
        _rate("mds", "warm", 0, 500),
        _rate("mds", "warm", 2, 800),
    ]
    judged = curves(metrics)
    assert judged["shard"] == ("cold", {0: 100, 2: 300})
    assert judged["mds"] == ("warm", {0: 500, 2: 800})
    assert headline({"shard": 2, "mds": 2}) == "mds"
    assert headline({"small_files": 1, "shard": 2}) == "shard"
    assert headline({}) is None


# --- advice --------------------------------------------------------------------------


def _sweep(layout: str, curve: dict[int, float], temp: str = "cold") -> list[Metric]:
    return [_rate(layout, temp, w, v) for w, v in curve.items()]


PARAMS = {"effective_cpus": 2, "batch_size": 32, "prefetch_factor": 2}


def _findings(metrics: list[Metric]) -> dict[str, object]:
    return {f.id: f for f in advise(metrics, PARAMS)}


def test_advice_workers_and_workers_above_cpus():
    found = _findings(_sweep("mds", {0: 2000, 1: 2200, 2: 6000, 4: 5000}))
    workers = found["loader.workers"]
    assert workers.severity is Severity.WARNING
    assert workers.gain.value == 3.0
    assert dataloader_line(PARAMS, 2) in workers.recommendation
    assert "persistent_workers=True, prefetch_factor=2" in workers.recommendation
    above = found["loader.workers-above-cpus"]
    assert above.severity is Severity.WARNING and "slower than 2" in above.title
    assert above.gain.value == 1.2


def test_advice_when_workers_do_not_help_or_help_past_the_cpus():
    flat = _findings(_sweep("shard", {0: 60000, 1: 20000, 2: 25000}))
    assert flat["loader.workers"].severity is Severity.OK
    past = _findings(_sweep("mds", {0: 2000, 2: 6000, 4: 12000}))
    assert past["loader.workers-above-cpus"].severity is Severity.INFO
    assert "2.0x more than 2" in past["loader.workers-above-cpus"].title


def test_advice_small_files_and_first_batch():
    metrics = _sweep("small_files", {0: 1000, 2: 2000}) + _sweep("shard", {0: 5000, 2: 10000})
    metrics.append(_labelled(Metric.single("first_batch_s.shard.w2", 1.5, "s")))
    found = _findings(metrics)
    small = found["loader.small-files"]
    assert small.severity is Severity.CRITICAL and small.gain.value == 5.0
    # The recipe is the fastest layout's (a plain shard here), never one measured slower.
    assert "os.pread" in small.recommendation and "MDSWriter" not in small.recommendation
    assert small.fix == {"layout": "shard"}
    mds = _findings(
        _sweep("small_files", {0: 1000, 2: 2000})
        + _sweep("shard", {0: 1500, 2: 3000})
        + _sweep("mds", {0: 5000, 2: 10000})
    )["loader.small-files"]
    assert "MDSWriter" in mds.recommendation and mds.fix == {"layout": "mds"}
    slow = found["loader.first-batch-slow"]
    assert slow.severity is Severity.INFO and "persistent_workers=True" in slow.recommendation
    # Small files compared with a shard judged in another cache state: no verdict.
    mixed = _sweep("small_files", {0: 1000}) + _sweep("shard", {0: 5000}, temp="warm")
    assert "loader.small-files" not in _findings(mixed)


def test_advice_names_streamings_own_cost():
    metrics = _sweep("shard", {0: 17000, 2: 17500}) + _sweep("mds", {0: 2000, 2: 3200, 4: 7200})
    found = _findings(metrics)
    overhead = found["loader.mds-overhead"]
    assert overhead.severity is Severity.INFO
    assert "5.3x fewer" in overhead.title and "7,200 with num_workers=4" in overhead.evidence
    close = _sweep("shard", {0: 1000, 2: 1200}) + _sweep("mds", {0: 900, 2: 1100})
    assert "loader.mds-overhead" not in _findings(close)


# --- the table ------------------------------------------------------------------------


def test_table_has_a_row_per_layout_cache_and_workers():
    metrics = [
        *_sweep("shard", {0: 1000.0, 2: 3000.0}),
        Metric.repeated("mbps.shard.cold.w2", [49.0, 50.0, 51.0], "MB/s"),
        Metric.single("first_batch_s.shard.w2", 0.25, "s"),
        Metric.single("batch_wait_ms.shard.cold.w2.p99", 7.5, "ms"),
        Metric.single("recommended_num_workers.shard", 2, "workers"),
        Metric.missing("throughput.mds", "samples/s", mds.INSTALL_HINT),
    ]
    rows, rest, notes = table(
        [_labelled(m) for m in metrics],
        {"effective_cpus": 2, "first_batch_cache": {"shard": "cold"}},
    )
    assert [r[:3] for r in rows] == [("shard", "cold", "0"), ("shard", "cold", "2")]
    assert rows[1][3:] == ("3,000", "", "50", "0.25", "", "7.500", "*")
    assert [m.name for m in rest] == ["recommended_num_workers.shard", "throughput.mds"]
    assert notes and notes[-1].startswith("* recommended")


def _labelled_sweep() -> tuple[list[Metric], dict]:
    metrics = [
        *_sweep("small_files", {0: 1000.0, 1: 1500.0, 2: 2000.0, 4: 2100.0}),
        *_sweep("shard", {0: 5000.0, 1: 9000.0, 2: 10000.0, 4: 9000.0}),
        *_sweep("shard", {0: 9000.0, 1: 12000.0, 2: 13000.0, 4: 12000.0}, temp="warm"),
        Metric.repeated("mbps.shard.cold.w2", [49.0, 50.0, 51.0], "MB/s"),
        Metric.single("first_batch_s.shard.w2", 1.5, "s"),
        Metric.single("batch_wait_ms.shard.cold.w2.p50", 0.5, "ms"),
        Metric.single("batch_wait_ms.shard.cold.w2.p99", 7.5, "ms"),
    ]
    params = {**PARAMS, "first_batch_cache": {"shard": "cold"}}
    done = complete(StageResult("loader", params, tuple(_labelled(m) for m in metrics)))
    return list(done.metrics), params


def test_rules_and_table_select_by_labels_not_names():
    """A metric renamed but labelled the same lands in the same finding and table row."""
    metrics, params = _labelled_sweep()
    renamed = [replace(m, name=f"x{i}") for i, m in enumerate(metrics)]
    found = advise(metrics, params)
    assert {f.id for f in found} >= {"loader.workers", "loader.small-files"}
    assert "loader.first-batch-slow" in {f.id for f in found}
    assert [f.to_dict() for f in advise(renamed, params)] == [f.to_dict() for f in found]
    rows, rest, notes = table(metrics, params)
    assert len(rows) == 12 and rows[6][:4] == ("shard", "cold", "2", "10,000")
    assert table(renamed, params)[0] == rows and table(renamed, params)[2] == notes
    assert [m.name for m in table(renamed, params)[1]] == [f"x{metrics.index(m)}" for m in rest]
    # Without labels nothing is found and no row is made, whatever the names say.
    unlabelled = [replace(m, labels={}) for m in metrics]
    assert advise(unlabelled, params) == []
    assert table(unlabelled, params)[0] == []


def test_the_table_is_loaders_alone():
    metrics, params = _labelled_sweep()
    profile = stage_sections(StageResult("profile", params, tuple(metrics)))[0]
    assert loader_render.HEADERS not in {s.headers for s in profile}
    loader = stage_sections(StageResult("loader", params, tuple(metrics)))[0]
    assert loader_render.HEADERS in {s.headers for s in loader}
    assert rules(Results({})) == []


def test_recommend_labels_its_figures_and_ids_its_caveat():
    metrics = _sweep("shard", {0: 1000.0, 2: 3000.0}) + _sweep("mds", {4: 500.0, 8: 900.0})
    done = complete(StageResult("loader", PARAMS, tuple(metrics)))
    assert done.metrics == tuple(metrics) and done.capacity is None  # measured, untouched
    rec, capacity, caveats = done.judged.figures, done.delivers, done.said
    q = {"quantity": "recommended_num_workers"}
    assert [(m.name, m.labels) for m in rec] == [
        ("recommended_num_workers.shard", {**q, "layout": "shard"}),
        ("recommended_num_workers", q),
    ]
    assert capacity is not None and capacity.name == "capacity (throughput.shard.cold.w2)"
    assert capacity.labels == {
        "quantity": "samples_per_s",
        "layout": "shard",
        "cache": "cold",
        "workers": 2,
    }
    assert [c.id for c in caveats] == ["loader.no-recommendation"]
    assert caveats[0].startswith("mds: no num_workers at or below the 2 effective CPUs")


# --- MosaicML Streaming ------------------------------------------------------------------


@pytest.mark.slow
def test_streaming_loads_without_torchvision():
    code = (
        "import sys\n"
        "from starvecheck.stages.samples.mds import load_streaming\n"
        "s = load_streaming()\n"
        "heavy = ('torchvision', 'transformers', 'streaming.vision')\n"
        "print(s.StreamingDataset.__name__, s.MDSWriter.__name__,\n"
        "      [m for m in heavy if m in sys.modules])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["StreamingDataset", "MDSWriter", "[]"]


def test_release_removes_the_datasets_shared_memory_and_locks(tmp_path):
    streaming = mds.load_streaming()
    import numpy as np

    before = streaming_leftovers()
    out = tmp_path / "mds"
    with streaming.MDSWriter(out=str(out), columns={"x": "ndarray:uint8:8"}) as writer:
        for i in range(20):
            writer.write({"x": np.full(8, i, np.uint8)})
    dataset = streaming.StreamingDataset(local=str(out), shuffle=True, batch_size=4)
    assert sum(1 for _ in dataset) == 20
    prefix = f"{dataset._shm_prefix_int:06}"
    assert any(n.startswith(prefix) for n in streaming_leftovers() - before)
    mds.release(dataset, streaming)
    assert settled(lambda: streaming_leftovers() - before) == set()


def test_scratch_adopts_files_a_library_wrote(tmp_path):
    with Scratch(str(tmp_path), prefix="t-") as scratch:
        scratch.mkdir("lib")
        (Path(scratch.path) / "lib" / "shard.00000.mds").write_bytes(b"x")
        scratch.adopt("lib")
        scratch.adopt("lib")  # twice: recorded once
        scratch.adopt("absent")  # never made: nothing to do
    assert list(tmp_path.iterdir()) == [] and scratch.leftovers == []


# --- the command --------------------------------------------------------------------------


@pytest.mark.slow
def test_loader_end_to_end_json(tmp_path):
    before = streaming_leftovers()
    r = run("loader", *SMALL, "--runs", "2", "--json", "-", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    stage = r.json["stages"][0]
    names = {m["name"] for m in stage["metrics"]}
    workers = stage["parameters"]["workers"]
    assert workers[:3] == [0, 1, 2]
    for layout in ("small_files", "shard", "mds"):
        for w in workers:
            for temp in ("cold", "warm"):
                base = f"{layout}.{temp}.w{w}"
                assert {
                    f"throughput.{base}",
                    f"mbps.{base}",
                    f"batch_wait_ms.{base}.p50",
                    f"batch_wait_ms.{base}.p99",
                } <= names
            assert f"first_batch_s.{layout}.w{w}" in names
        assert f"recommended_num_workers.{layout}" in names
    by = {m["name"]: m for m in stage["metrics"]}
    # Every figure, the capacity too, labelled with what it is.
    for m in [*stage["metrics"], stage["capacity"]]:
        assert m["labels"].get("quantity"), m["name"]
    assert by["throughput.shard.cold.w1"]["labels"] == {
        "quantity": "samples_per_s",
        "layout": "shard",
        "cache": "cold",
        "workers": 1,
    }
    assert by["recommended_num_workers.mds"]["labels"] == {
        "quantity": "recommended_num_workers",
        "layout": "mds",
    }
    assert by["recommended_num_workers"]["labels"] == {"quantity": "recommended_num_workers"}
    assert r.json["schema_version"] == 3
    cpus = r.json["machine"]["cpu"]["effective_cpus"]
    rec = by["recommended_num_workers"]
    assert rec["unit"] == "workers" and 0 <= rec["value"] <= cpus
    assert by["recommended_num_workers.mds"]["value"] == rec["value"]  # mds is the headline
    assert stage["capacity"]["value"] > 0 and "throughput.mds" in stage["capacity"]["name"]
    assert {f["id"] for f in stage["findings"]} >= {"loader.workers", "loader.small-files"}
    assert list(tmp_path.iterdir()) == []
    assert settled(lambda: streaming_leftovers() - before) == set()


def test_without_the_streaming_extra_mds_is_missing_with_the_fix(tmp_path, monkeypatch):
    def unavailable() -> None:
        raise mds.StreamingUnavailable(mds.INSTALL_HINT)

    monkeypatch.setattr(mds, "load_streaming", unavailable)
    png = tmp_path / "loader.png"
    data = tmp_path / "data"
    data.mkdir()
    r = run(
        "loader", *SMALL, "--no-cold", "--workers", "0,1", "--plot", str(png),
        "--markdown", "-", str(data),
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "| throughput.mds | n/a | samples/s | install the streaming extra: pip install" in (
        r.stdout
    )
    assert "| shard | warm | 1 |" in r.stdout and "| mds |" not in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(data.iterdir()) == []


def test_existing_files_are_read_and_left_as_they_were(tmp_path):
    for i in range(40):
        path = tmp_path / f"{i:03d}.jpg"
        path.write_bytes(os.urandom(1000 + 37 * i))
        os.utime(path, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    r = run("loader", "--existing", "--quick", "--workers", "0,2", "--json", "-", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    stage = r.json["stages"][0]
    by = {m["name"]: m for m in stage["metrics"]}
    assert by["throughput.files.warm.w2"]["value"] > 0
    assert stage["parameters"]["files_read"] == 40
    assert by["recommended_num_workers"]["value"] in (0, 2)
    assert all(m["labels"].get("quantity") for m in stage["metrics"])
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert after == before


def test_existing_files_caveats_have_ids(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * (9 << 20))
    (tmp_path / "a.jpg").write_bytes(b"y" * 100)
    os.symlink(tmp_path / "a.jpg", tmp_path / "link.jpg")
    plan = Plan(samples=10, sample_size=0, workers=(0,), runs=1)
    _, params, caveats = sources.existing_sources(str(tmp_path), plan)
    assert params["files_read"] == 1
    assert all(isinstance(c, Caveat) for c in caveats)
    ids = [c.id for c in caveats]
    assert ids[:2] == ["loader.large-files-skipped", "loader.symlinks-skipped"]
    assert ids[-1] == "loader.raw-bytes"
    assert caveats[0].startswith("1 files over 8 MiB (shards, archives) were not read")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--workers", "x"], "--workers"),
        (["--workers", "1,,2"], "--workers"),
        (["--workers", "-1"], "--workers"),
        (["--sample-size", "big"], "--sample-size"),
        (["--plot", "/nonexistent/dir/p.png"], "--plot"),
        (["--batch-size", "0"], "batch-size"),
        (["/nonexistent/data"], "no such file or directory"),
        (["--existing", "EMPTY"], "no readable"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, args, needle):
    args = [str(tmp_path) if a == "EMPTY" else a for a in args]
    where = [] if any(a.startswith("/") or a == str(tmp_path) for a in args) else [str(tmp_path)]
    r = run("loader", "--quick", *args, *where)
    assert r.exit_code == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("starvecheck: error:"), r.stderr
    assert needle in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_interrupt_during_the_sweep_leaves_nothing_behind(tmp_path):
    before = streaming_leftovers()
    proc = subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "loader", "--quick", "--json", "-", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        # The sweep has begun once the MDS index is written and workers have been started.
        deadline = time.monotonic() + 60
        seen: set[int] = set()
        while time.monotonic() < deadline:
            seen |= children(proc.pid)
            if list(tmp_path.glob("starvecheck-loader-*/mds/index.json")) and len(seen) >= 2:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        else:
            pytest.fail("the sweep never started")
        time.sleep(1.0)
        seen |= children(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err.strip() == "starvecheck: error: interrupted"  # no traceback, no leak warning
    assert list(tmp_path.iterdir()) == []
    assert settled(lambda: streaming_leftovers() - before) == set()
    # A worker torch had to terminate takes a moment to go.
    deadline = time.monotonic() + 5
    while [p for p in seen if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in seen if alive(p)], "worker processes left running"
