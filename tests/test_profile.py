"""`starvecheck profile`: the training loop end to end on the CPU, its advice, and
its refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from starvecheck.advice.profile import rules
from starvecheck.advice.results import Results
from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.render import profile as profile_table
from starvecheck.render.sections import stage_sections
from starvecheck.stages.base import RunContext
from starvecheck.stages.options import ProfileOptions
from starvecheck.stages.profile import loop as profile_loop
from starvecheck.stages.profile import stage as profile_stage
from tests.conftest import run
from tests.fixtures.labels.profile import labels as profile_labels

PHASES = ("dataloader_wait", "h2d_transfer", "forward", "backward", "optimizer")


def metrics(r):
    return {m["name"]: m for m in r.json["stages"][0]["metrics"]}


def quick_profile(tmp_path):
    """`profile --quick` over both layouts with 0 and 1 workers, 3 steps, its traces
    kept: the report's figures and each trace read back by `profile --trace`, by
    scenario key (small_files.w0 ...)."""
    pytest.importorskip("transformers")
    traces = tmp_path / "traces"
    r = run("profile", "--quick", "--workers", "0,1", "--steps", "3", "--trace-dir",
            str(traces), "--json", "-", str(tmp_path))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert len(list(traces.glob("*.pt.trace.json"))) == 4  # one trace per scenario, kept
    back = {}
    for path in sorted(traces.glob("*.pt.trace.json")):
        # small_files-w0.<host>.<n>.pt.trace.json -> small_files.w0
        key = path.name.split(".", 1)[0].replace("-", ".")
        b = run("profile", "--trace", str(path), "--json", "-")
        assert b.exit_code == 0, b.stderr
        back[key] = b
    return r, back


@pytest.mark.slow
def test_quick_loop_reports_both_layouts_with_five_phases(tmp_path):
    r, back = quick_profile(tmp_path)
    m = metrics(r)
    for x in m.values():  # every figure labelled, as tests/fixtures/labels knows its name
        assert x["labels"]["quantity"] and x["labels"] == profile_labels(x["name"], x["unit"])
    for layout in ("small_files", "mds"):
        for w in (0, 1):
            key = f"{layout}.w{w}"
            for phase in PHASES:
                assert m[f"phase_ms.{phase}.{key}"]["n"] == 3
            share = m[f"data_wait_share.{key}"]["value"]
            assert 0 <= share < 1
            # Each step is its five phases, step by step (medians of 3 noisy steps
            # need not add up, so the raw values are compared).
            phases = [m[f"phase_ms.{p}.{key}"]["values"] for p in PHASES]
            per_step = [sum(v) for v in zip(*phases, strict=True)]
            assert m[f"step_ms.{key}"]["values"] == pytest.approx(per_step, rel=1e-9)
            wait = sum(m[f"phase_ms.dataloader_wait.{key}"]["values"])
            assert share == pytest.approx(wait / sum(per_step), rel=1e-9)
    assert not list(tmp_path.glob("starvecheck-profile-*"))  # the token data is removed
    assert "USDT" not in r.stderr and "Warning" not in r.stderr

    # Each trace, read back by `profile --trace`, holds the loop's own steps (the
    # schedule's warm-up is not in the trace) and its five phases. The loop's clock
    # brackets each phase's record_function, so a phase read from the trace lies within
    # the loop's figure for the same step, however loaded the machine (how close the
    # two come is the accuracy lane's check below: on a busy machine the main thread
    # can wait milliseconds between the clock and the profiler's own timestamp).
    assert sorted(back) == [f"{lay}.w{w}" for lay in ("mds", "small_files") for w in (0, 1)]
    for key, b in back.items():
        t = metrics(b)
        assert t["step_ms"]["n"] == 3 and "first_step_ms" not in t
        assert b.json["stages"][0]["parameters"]["data_wait_source"].startswith("DATALOADER_WAIT")
        for phase in PHASES:
            read, timed = t[f"phase_ms.{phase}"]["values"], m[f"phase_ms.{phase}.{key}"]["values"]
            assert len(read) == len(timed) == 3, (key, phase)
            for a, b_ in zip(read, timed, strict=True):  # µs timestamps, two clocks
                assert 0 < a <= b_ * 1.01 + 0.05, (key, phase, read, timed)
        assert 0 <= t["data_wait_share"]["value"] < 1
        assert t["gpu_idle_share"]["value"] is None  # a CPU run: no kernels


@pytest.mark.accuracy
def test_a_trace_read_back_gives_the_loops_own_figures(tmp_path):
    """On a quiet machine the trace's phases agree with the loop's clock: medians
    within 10% or 1 ms, the data-wait share within 3 points."""
    r, back = quick_profile(tmp_path)
    m = metrics(r)
    for key, b in back.items():
        t = metrics(b)
        for phase in PHASES:
            assert t[f"phase_ms.{phase}"]["median"] == pytest.approx(
                m[f"phase_ms.{phase}.{key}"]["median"], rel=0.1, abs=1.0
            ), (key, phase)
        assert t["data_wait_share"]["value"] == pytest.approx(
            m[f"data_wait_share.{key}"]["value"], abs=0.03
        )


def test_collate_reads_bytes_as_u16_tokens_modulo_the_vocabulary():
    torch = pytest.importorskip("torch")
    raw = np.array([1, 0, 2, 0, 0xFF, 0x7F], np.uint8)  # 1, 2, 32767
    batch = [torch.from_numpy(raw.copy()), {"data": raw.copy()}]
    tokens = profile_loop.collate_tokens(batch, vocab=1000)
    assert tokens.tolist() == [[1, 2, 767], [1, 2, 767]]
    assert tokens.dtype == torch.int64


def test_no_cuda_device_is_exit_3(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = run("profile", "--device", "cuda", str(tmp_path))
    assert r.exit_code == 3 and "no CUDA device" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace-dir", "/nonexistent/a/b"], "does not exist"),
        (["--model-size", "huge"], "--model-size"),
        (["--workers", "x"], "--workers"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(argv, message):
    r = run("profile", *argv)
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1


def _labelled(m: Metric) -> Metric:
    return m.labelled(**profile_labels(m.name, m.unit))


def judged(ms, params=None) -> dict:
    """advice/profile's findings on a loop's result holding these metrics."""
    result = StageResult("profile", dict(params or {}), tuple(ms))
    return {f.id: f for f in rules(Results({"profile": result}))}


def advice(values):
    ms = [
        _labelled(Metric.single(f"data_wait_share.{k}", v, "fraction")) for k, v in values.items()
    ]
    return judged(ms, {"effective_cpus": 2})


def test_data_wait_thresholds_follow_five_and_twenty_percent():
    assert advice({"mds.w0": 0.04})["profile.data-bound"].severity.value == "ok"
    assert advice({"mds.w0": 0.06})["profile.data-bound"].severity.value == "warning"
    assert advice({"mds.w0": 0.25})["profile.data-bound"].severity.value == "critical"


def test_workers_and_small_files_findings():
    f = advice({"small_files.w0": 0.45, "small_files.w2": 0.15, "mds.w0": 0.30, "mds.w2": 0.02})
    assert f["profile.workers"].severity.value == "critical"
    assert "num_workers=2" in f["profile.workers"].recommendation
    assert f["profile.workers"].gain.value == pytest.approx(0.30)
    assert f["profile.small-files"].gain.value == pytest.approx(0.13)
    assert f["profile.data-bound"].severity.value == "ok"  # mds with 2 workers is fed


def test_the_worker_count_goes_through_the_one_rule():
    """The fewest within 2 points of the least wait, at or below the effective CPUs:
    4 workers on 2 CPUs are not recommended, nor 2 where 1 waits as little."""
    values = {"mds.w0": 0.40, "mds.w1": 0.10, "mds.w2": 0.09, "mds.w4": 0.01}
    ms = [
        _labelled(Metric.single(f"data_wait_share.{k}", v, "fraction")) for k, v in values.items()
    ]
    f = judged(ms, {"effective_cpus": 2})["profile.workers"]
    assert "num_workers=1" in f.recommendation and "num_workers=4" not in f.recommendation
    assert f.gain.value == pytest.approx(0.30)


def test_cold_says_whether_the_cache_was_really_emptied(tmp_path):
    pytest.importorskip("transformers")
    options = ProfileOptions(str(tmp_path), quick=True, cold=True, workers=(0,), steps=2,
                             device="cpu")  # fmt: skip
    ctx = RunContext()
    r = profile_stage.STAGE.measure(profile_stage.STAGE.plan(options, ctx), ctx)
    assert r.findings == ()  # judging comes after, once per report
    assert r.has_caveat("profile.cold")
    for layout in ("small_files", "mds"):
        resident = r.value(quantity="resident_before", layout=layout)
        warned = [
            c for c in r.caveats if c.startswith("--cold: ") and f"of {layout} was still" in c
        ]
        assert bool(warned) == (resident > 0.05)  # tmpfs keeps it all, and says so
        assert all(c.id == "cache.not-cold" for c in warned)


def _h2d(h2d_ms, step_ms, device="cuda"):
    ms = [
        Metric.single("data_wait_share.mds.w2", 0.01, "fraction"),
        Metric.repeated("phase_ms.h2d_transfer.mds.w2", h2d_ms, "ms"),
        Metric.repeated("step_ms.mds.w2", step_ms, "ms"),
    ]
    ms = [_labelled(m) for m in ms]
    return judged(ms, {"device": device}).get("profile.h2d")


def test_h2d_copies_over_a_tenth_of_the_step_are_a_finding():
    assert _h2d([1.0, 1.0], [100.0, 100.0]) is None
    assert _h2d([10.0, 10.0], [100.0, 100.0]) is None  # exactly 10%: not over
    f = _h2d([30.0, 10.0], [100.0, 100.0])  # summed: 40 of 200
    assert f is not None and f.gain.value == pytest.approx(0.20)
    assert "non_blocking=True" in f.recommendation and "mds with num_workers=2" in f.evidence


# --- the text layout: raw text tokenized on the data path ---------------------------


@pytest.mark.slow
def test_tokenizer_adds_a_text_layout_tokenized_in_the_loader(tmp_path):
    pytest.importorskip("transformers")
    from tests.conftest import tiny_tokenizer

    tok = tiny_tokenizer(tmp_path / "tok")
    data = tmp_path / "data"
    data.mkdir()
    r = run("profile", "--quick", "--workers", "0,1", "--steps", "2", "--tokenizer", str(tok),
            "--json", "-", str(data))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    m = metrics(r)
    for w in (0, 1):
        for phase in PHASES:
            assert m[f"phase_ms.{phase}.text.w{w}"]["n"] == 2
        assert 0 <= m[f"data_wait_share.text.w{w}"]["value"] < 1
    assert r.json["stages"][0]["parameters"]["layouts"] == ["small_files", "mds", "text"]
    assert list(data.iterdir()) == []  # the text shard went with the rest
    assert "TOKENIZERS_PARALLELISM" not in r.stderr and "huggingface/tokenizers" not in r.stderr


def test_text_samples_are_token_ids_cut_or_padded_to_the_row(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from starvecheck.inputs.tokenizers import load_tokenizer
    from starvecheck.scratch.directory import Scratch
    from starvecheck.stages.samples.sources import text_source
    from tests.conftest import tiny_tokenizer

    tok = load_tokenizer(str(tiny_tokenizer(tmp_path / "tok")))
    texts = ["the quick brown fox", "the lazy dog " * 20, "zebra"]
    with Scratch(str(tmp_path), prefix="t-") as scratch:
        source = text_source(scratch, texts, tok, seq_len=8, vocab=5)
        dataset = source.make(0)
        rows = [dataset[i] for i in range(len(dataset))]
        batch = source.collate(rows)
        source.release(dataset)
    assert batch.shape == (3, 8) and batch.dtype == torch.int64
    assert int(batch.max()) < 5  # modulo the model's vocabulary
    assert rows[0][4:].tolist() == [0, 0, 0, 0]  # four words, then padding
    assert rows[1].count_nonzero() > 4  # a long text fills the row
    assert source.layout.name == "text" and source.layout.paths == ["text.bin", "text.idx"]


def test_a_tokenizer_that_is_not_there_is_one_line_before_anything_is_written(tmp_path):
    r = run("profile", "--quick", "--tokenizer", str(tmp_path / "nope"), str(tmp_path))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "no tokenizer found in local files" in r.stderr
    assert list(tmp_path.iterdir()) == []


def _tokenize_finding(text, mds):
    return advice({"text.w2": text, "mds.w2": mds, "mds.w0": mds}).get("profile.tokenize")


def test_tokenizing_five_points_longer_than_shards_is_a_finding():
    assert _tokenize_finding(0.06, 0.02) is None  # 4 points
    f = _tokenize_finding(0.30, 0.02)
    assert f is not None and f.severity.value == "critical"
    assert f.gain.value == pytest.approx(0.28)
    assert "dataset.map(tokenize, batched=True" in f.recommendation


# --- labels: what the table and the rules select by ---------------------------------


def _loop_metrics() -> list[Metric]:
    """A loop's figures at two layouts and num_workers, as the stage labels them."""
    out = []
    for layout, w, wait, h2d in (
        ("small_files", 0, 0.40, 30.0),
        ("small_files", 2, 0.30, 2.0),
        ("mds", 2, 0.02, 2.0),
    ):
        key = f"{layout}.w{w}"
        out += [
            Metric.repeated(f"phase_ms.{p}.{key}", [h2d if p == "h2d_transfer" else 5.0] * 3, "ms")
            for p in PHASES
        ]
        out += [
            Metric.repeated(f"step_ms.{key}", [100.0] * 3, "ms"),
            Metric.single(f"data_wait_share.{key}", wait, "fraction"),
            Metric.single(f"samples_per_s.{key}", 80.0, "samples/s"),
        ]
    return [_labelled(m) for m in out]


def test_table_and_rules_select_by_labels_not_names():
    ms = _loop_metrics()
    r = StageResult("profile", {"device": "cuda", "effective_cpus": 2}, tuple(ms))
    renamed = dataclasses.replace(
        r, metrics=tuple(dataclasses.replace(m, name=f"figure{i}") for i, m in enumerate(ms))
    )
    rows, rest = profile_table.split(r.metrics)
    assert [row[:2] for row in rows] == [("small_files", "0"), ("small_files", "2"), ("mds", "2")]
    assert rest == []
    assert rows[0][-2:] == ("40.0%", "80.0")
    assert profile_table.split(renamed.metrics) == (rows, [])
    found = judged(r.metrics, r.parameters)
    assert found.keys() == {
        "profile.data-bound",
        "profile.workers",
        "profile.small-files",
        "profile.h2d",
    }
    assert judged(renamed.metrics, renamed.parameters) == found
    assert "small_files with num_workers=0" in found["profile.h2d"].evidence


def test_the_loop_table_is_profiles_alone():
    ms = _loop_metrics()
    other = stage_sections(StageResult("loader", {}, tuple(ms)))[0]
    assert profile_table.HEADERS not in {s.headers for s in other}
    # A trace reports under profile too, but its figures carry no layout: not the loop's.
    flat = [Metric.single("data_wait_share", 0.3, "fraction", {"quantity": "data_wait_share"})]
    assert profile_table.split(flat) == ([], flat)
    assert judged(flat) == {}


def test_trace_dir_is_made_by_the_command_before_the_stage_plans(tmp_path):
    from starvecheck.cli import args
    from starvecheck.core.status import UsageError

    with pytest.raises(UsageError, match="does not exist"):
        args.output_dir("--trace-dir", str(tmp_path / "a" / "b"))
    made = args.output_dir("--trace-dir", str(tmp_path / "t"))
    options = ProfileOptions(str(tmp_path), device="cpu", trace_dir=made)
    plan = profile_stage.STAGE.plan(options, RunContext())
    assert plan.plan.trace_dir == str((tmp_path / "t").resolve()) and (tmp_path / "t").is_dir()


@pytest.mark.slow
def test_profile_leaves_nothing_in_tmpdir(tmp_path):
    """torch.profiler reads inductor's config, which made torchinductor_<user> in
    TMPDIR and left it there after every run. In a fresh process with a private
    TMPDIR, nothing is left there, nor in PATH."""
    pytest.importorskip("transformers")
    import os
    import subprocess
    import sys

    data, tmp = tmp_path / "data", tmp_path / "tmp"
    data.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["TMPDIR"] = str(tmp)
    r = subprocess.run(
        [sys.executable, "-m", "starvecheck", "profile", "--quick", "--workers", "0",
         "--steps", "2", str(data)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp.iterdir()) == []
    assert sorted(p.name for p in data.iterdir()) == []


@pytest.mark.slow
def test_building_the_training_step_leaves_nothing_in_tmpdir(tmp_path):
    """doctor builds the same model to time the GPU step, with no scratch directory:
    the cache directory the import makes is removed again where it is the import's
    and empty; one that was there before is left, as is what it holds."""
    pytest.importorskip("transformers")
    import os
    import subprocess
    import sys

    build = "from starvecheck.stages.trainstep import build_model; build_model('tiny', 'cpu')"
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    fresh, kept = tmp_path / "fresh", tmp_path / "kept"
    fresh.mkdir()
    (kept / "torchinductor_x").mkdir(parents=True)
    for tmp in (fresh, kept):
        r = subprocess.run(
            [sys.executable, "-c", build], env={**env, "TMPDIR": str(tmp), "USER": "x",
             "LOGNAME": "x"}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in fresh.iterdir()) == []
    assert sorted(p.name for p in kept.iterdir()) == ["torchinductor_x"]
