"""`starvecheck doctor` end to end: the report, the chain and weakest link, options and
the workload file, usage errors, Ctrl-C (its stored reports are rendered with every
golden in tests/test_render.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from starvecheck.core.units import size_name
from tests.conftest import run, tiny_tokenizer

LINKS = ["storage", "loader", "pcie", "gpu"]


@pytest.mark.slow
def test_quick_json_holds_every_stage_the_chain_and_the_weakest_link(tmp_path):
    r = run("doctor", "--quick", "--json", "-", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    d = r.json
    assert d["command"] == "doctor"
    assert [s["stage"] for s in d["stages"]] == ["env", "io", "loader", "starve", "pad", "doctor"]
    chain = {x["link"]: x for x in d["chain"]}
    assert [x["link"] for x in d["chain"]] == LINKS
    demand = 16 / 0.4  # the defaults, with the assumed step on this CPU-only machine
    for name, link in chain.items():
        assert link["demand_samples_per_s"] == pytest.approx(demand)
        if name == "pcie":
            assert link["capacity_samples_per_s"] is None and link["reason"]
        else:
            assert link["capacity_samples_per_s"] > 0 and link["basis"], name
    assert chain["gpu"]["capacity_samples_per_s"] == pytest.approx(demand)
    assert d["weakest_link"] in LINKS
    lowest = min(
        (x for x in d["chain"] if x["capacity_samples_per_s"] is not None),
        key=lambda x: (x["capacity_samples_per_s"], x["link"] != "gpu"),
    )
    assert d["weakest_link"] == lowest["link"]
    assert d["workload"]["step_ms"] == {"value": 400.0, "source": "assumed"}
    doctor = d["stages"][-1]
    assert any("assumed figure, not measured" in c for c in doctor["caveats"])
    # Each stage ran with the workload's figures.
    by = {s["stage"]: s for s in d["stages"]}
    assert by["io"]["parameters"]["sample_size_bytes"] == 8192
    assert by["loader"]["parameters"]["layouts"] == ["shard"]
    assert by["starve"]["parameters"]["step_ms"] == 400.0
    assert by["starve"]["parameters"]["batch_size"] == 16
    assert by["pad"]["parameters"]["context"] == 2048
    # The checklist is the stages' findings, deduplicated and ranked.
    ids = [f["id"] for f in d["checklist"]]
    assert len(ids) == len(set(ids))
    stage_ids = {f["id"] for s in d["stages"] for f in s["findings"] if f["severity"] != "ok"}
    assert set(ids) == stage_ids
    assert list(tmp_path.iterdir()) == []  # scratch data removed


def test_only_pad_judges_padding_and_leaves_the_rest_null_with_reasons():
    r = run("doctor", "--only", "pad", "--step-ms", "100", "--json", "-")
    assert r.exit_code == 0, r.stderr
    d = r.json
    assert [s["stage"] for s in d["stages"]] == ["env", "pad", "doctor"]
    chain = {x["link"]: x for x in d["chain"]}
    assert chain["storage"]["reason"] == "not measured: io not selected (--only/--skip)"
    assert chain["loader"]["capacity_samples_per_s"] is None
    pad = {m["name"]: m["value"] for m in d["stages"][1]["metrics"]}
    demand = 16 / 0.1
    # Padding is no link: the GPU's rate with less padding is part of the gpu link.
    assert "padding" not in chain
    gpu = chain["gpu"]
    assert gpu["capacity_samples_per_s"] == pytest.approx(demand)
    assert gpu["parts"]["padding_fixed"] == pytest.approx(
        demand * pad["efficiency.padding_free"] / pad["efficiency.dynamic"]
    )
    assert d["workload"]["step_ms"] == {"value": 100.0, "source": "option"}
    assert d["weakest_link"] == "gpu"  # only the GPU measured: its step is what is judged
    assert "no pipeline link measured" in d["weakest_summary"]
    assert not [f for f in d["checklist"] if f["id"] == "doctor.weakest-link"]
    (waste,) = [f for f in d["checklist"] if f["id"] == "pad.waste"]
    assert waste["severity"] == "warning" and "embedded Alpaca-like" in waste["title"]


def test_workload_file_and_options_reach_the_stages(tmp_path):
    f = tmp_path / "w.toml"
    f.write_text('batch_size = 64\ncontext = 512\ncurrent = "padding_free"\nstep_ms = 1000\n')
    r = run("doctor", "--only", "pad", "--workload", str(f), "--context", "1024", "--json", "-")
    assert r.exit_code == 0, r.stderr
    d = r.json
    w = d["workload"]
    assert w["batch_size"] == {"value": 64, "source": "file"}
    assert w["context"] == {"value": 1024, "source": "option"}
    params = d["stages"][1]["parameters"]
    assert (params["batch_size"], params["context"], params["current"]) == (
        64,
        1024,
        "padding_free",
    )
    # The best strategy already: padding is exactly at demand; on a tie the GPU is the weakest.
    assert d["weakest_link"] == "gpu"


@pytest.mark.slow
def test_tokenizer_measures_the_cpu_per_sample_and_counts_the_datasets_tokens(tmp_path):
    tok = tiny_tokenizer(tmp_path / "tok")
    data = tmp_path / "train.jsonl"
    rows = [{"instruction": "the quick brown fox " * n, "output": "dog"} for n in range(1, 40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run(
        "doctor",
        "--only",
        "starve,pad",
        "--tokenizer",
        str(tok),
        "--dataset",
        str(data),
        "--field",
        "instruction,output",
        "--step-ms",
        "20",
        "--quick",
        "--json",
        "-",
    )
    assert r.exit_code == 0, r.stderr
    d = r.json
    by = {s["stage"]: s for s in d["stages"]}
    measured = by["starve"]["parameters"]["sample_cpu_ms"]
    assert by["starve"]["parameters"]["work"] == "tokenize"
    assert d["workload"]["cpu_ms_per_sample"] == {"value": measured, "source": "measured"}
    assert by["pad"]["parameters"]["tokenizer"] == str(tok)
    assert by["pad"]["parameters"]["fields"] == ["instruction", "output"]
    assert next(m for m in by["pad"]["metrics"] if m["name"] == "samples")["value"] == 39
    loader = next(x for x in d["chain"] if x["link"] == "loader")
    assert loader["limited_by"] == "cpu" and loader["capacity_samples_per_s"] > 0


def test_a_workload_file_describes_a_real_job(tmp_path):
    """cpu_ms_per_sample, dataset, field and tokenizer together: the job's own CPU cost
    per sample stands (it is all of its preprocessing), and the tokenizer counts the
    dataset's tokens; the report says where each figure came from."""
    tok = tiny_tokenizer(tmp_path / "tok")
    data = tmp_path / "train.jsonl"
    rows = [{"instruction": "the quick brown fox " * n, "output": "dog"} for n in range(1, 40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = tmp_path / "job.toml"
    f.write_text(
        f'cpu_ms_per_sample = 3\ndataset = "{data}"\nfield = ["instruction", "output"]\n'
        f'tokenizer = "{tok}"\nstep_ms = 20\n'
    )
    r = run("doctor", "--workload", str(f), "--only", "starve,pad", "--quick", "--json", "-")
    assert r.exit_code == 0, r.stderr
    d = r.json
    by = {s["stage"]: s for s in d["stages"]}
    assert by["starve"]["parameters"]["work"] == "cpu"
    assert by["starve"]["parameters"]["sample_cpu_ms"] == 3
    assert d["workload"]["cpu_ms_per_sample"] == {"value": 3, "source": "file"}
    assert d["workload"]["tokenizer"]["source"] == "file"
    assert by["pad"]["parameters"]["tokenizer"] == str(tok)
    assert next(m for m in by["pad"]["metrics"] if m["name"] == "samples")["value"] == 39


def test_terminal_and_markdown_show_the_chain_and_the_weakest_link():
    r = run("doctor", "--only", "pad", "--step-ms", "100")
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert out.index("workload") < out.index("chain") < out.index("Checklist")
    assert "<- weakest" in out and "Weakest link: gpu (no pipeline link measured): less" in out
    assert "step_ms            100 ms per step                     option" in out
    md = run("doctor", "--only", "pad", "--step-ms", "100", "--markdown", "-")
    assert "### Chain" in md.stdout and "| **gpu** |" in md.stdout
    assert "**<- weakest**" in md.stdout


def test_fail_on_gates_on_findings(monkeypatch):
    # env always runs, and this machine's own facts (a rotational disk, a small
    # /dev/shm) would decide the exit: judged on no machine findings, the gate sees
    # the workload's alone.
    from starvecheck.advice import env as env_advice

    monkeypatch.setattr(env_advice, "advise", lambda m: ())

    def severities(r) -> dict[str, str]:
        return {f["id"]: f["severity"] for s in r.json["stages"] for f in s["findings"]}

    # The embedded lengths: a warning, never critical (an assumed input).
    only_pad = ("doctor", "--only", "pad", "--step-ms", "100", "--json", "-")
    assert run(*only_pad, "--fail-on", "critical").exit_code == 0
    warned = run(*only_pad, "--fail-on", "warning")
    assert warned.exit_code == 1
    assert severities(warned) == {"pad.waste": "warning"}
    # Padding-free already: the same gate passes, and pad says so.
    ok = run(*only_pad, "--current", "padding_free", "--fail-on", "warning")
    assert ok.exit_code == 0, ok.stderr
    assert severities(ok) == {"pad.waste": "ok"}
    assert ok.json["checklist"] == []


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--only", "io,disk"], "--only 'io,disk': unknown stage disk; choose from io, loader"),
        (["--only", "io", "--skip", "pad"], "--only and --skip: choose one"),
        (["--skip", ""], "unknown stage"),
        (["--batch-size", "0"], "--batch-size: batch_size = 0: expected 1 to 1,000,000"),
        (["--sample-size", "huge"], "--sample-size: sample_size = 'huge'"),
        (["--layout", "tar"], "--layout: layout = 'tar': expected one of shard, small_files"),
        (["--current", "x"], "--current: current = 'x'"),
        (["--field", "text"], "--field applies to --dataset"),
        (["--workload", "/nonexistent.toml"], "--workload /nonexistent.toml: no such file"),
        (["--step-ms", "0"], "'--step-ms': 0: expected from 0.001 to 600,000"),
        (["/nonexistent-dir"], "/nonexistent-dir: no such file or directory"),
    ],
)
def test_usage_errors_are_one_line(args, needle):
    r = run("doctor", *args)
    assert r.exit_code == 2, r.stderr
    assert needle in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"STARVECHECK_SLOW_RANKS": "one:20"}, "STARVECHECK_SLOW_RANKS='one:20': expected"),
        ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK='3', WORLD_SIZE='2'"),
    ],
)
def test_bad_environment_is_one_line(env, needle):
    r = run("doctor", "--only", "pad", env=env)
    assert r.exit_code == 2 and needle in r.stderr and r.stderr.count("\n") == 1


def test_help_lists_doctor_and_imports_nothing_heavy():
    code = (
        "import sys\nfrom starvecheck.cli import main\n"
        "try:\n    main(['doctor', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'numpy', 'transformers', 'streaming', 'matplotlib')"
        " if m in sys.modules]\nprint(heavy, file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--workload" in p.stdout and "--cpu-ms-per-sample" in p.stdout
    assert p.stderr.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
@pytest.mark.parametrize(
    "marker", ["starvecheck-io-*/shard.bin", "starvecheck-loader-*/shard.idx"], ids=["io", "loader"]
)
def test_interrupt_leaves_the_directory_as_it_was(tmp_path, marker):
    (tmp_path / "mine.txt").write_text("the user's file")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "doctor", "--quick", "--json", "-", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # interrupt while the stage's data is on disk
            if list(tmp_path.glob(marker)):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
        else:
            pytest.fail(f"{marker} never appeared")
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err.strip() == "starvecheck: error: interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "mine.txt").read_text() == "the user's file"


# --- rendering against a stored report -----------------------------------------------

# doctor's goldens (doctor-quick: a --quick run; doctor-nodes: a torchrun with a slowed
# rank) are read back, written again and rendered byte for byte with every other golden
# in tests/test_render.py.


# --- the pcie stage: through its interface (a stand-in: no CUDA here), and the real one --


def _fake_pcie(monkeypatch, unavailable: str | None) -> list:
    """The real pcie stage with its CUDA half stood in for: whether CUDA is there, and
    the measurement (round rates per size, labelled as the stage labels them); records
    the plans doctor hands it."""
    from starvecheck.core.metric import Metric
    from starvecheck.core.model import StageResult
    from starvecheck.core.schema.pcie_schema1 import schema1_labelled as labelled
    from starvecheck.stages.pcie import stage as pcie

    calls: list = []
    known = {256 << 10: 9.0, 1 << 20: 12.0, 16 << 20: 20.0, 256 << 20: 24.0}

    def run_stage(plan, machine, progress, warn):
        calls.append(plan)
        metrics = [
            Metric.repeated(f"h2d.pinned.{size_name(s)}", [known[s]], "GB/s") for s in plan.sizes
        ]
        return StageResult("pcie", metrics=tuple(labelled(metrics)))

    monkeypatch.setattr(pcie, "cuda_unavailable", lambda: unavailable)
    monkeypatch.setattr(pcie, "run", run_stage)
    return calls


def test_pcie_link_from_the_pcie_stage(monkeypatch):
    calls = _fake_pcie(monkeypatch, None)
    r = run("doctor", "--only", "pad,pcie", "--step-ms", "100", "--quick", "--json", "-")
    assert r.exit_code == 0, r.stderr
    # 16 samples x 2,048 tokens x 8 bytes = 256 KiB a batch: doctor adds that size to
    # pcie's sweep, so the link is the rate at the batch's own size, 9 GB/s.
    assert [(p.sizes, p.quick) for p in calls] == [
        ((256 << 10, 1 << 20, 16 << 20, 256 << 20), True)
    ]
    d = r.json
    assert [s["stage"] for s in d["stages"]] == ["env", "pad", "pcie", "doctor"]
    pcie = next(x for x in d["chain"] if x["link"] == "pcie")
    assert pcie["capacity_samples_per_s"] == pytest.approx(9e9 / 16384)
    assert "256KiB" in pcie["basis"]


def test_pcie_link_null_with_the_stages_reason(monkeypatch):
    calls = _fake_pcie(monkeypatch, "no CUDA device (torch.cuda.is_available() is False)")
    r = run("doctor", "--only", "pcie", "--step-ms", "100", "--json", "-")
    pcie = next(x for x in r.json["chain"] if x["link"] == "pcie")
    assert pcie["capacity_samples_per_s"] is None and calls == []
    assert pcie["reason"] == "not measured: no CUDA device (torch.cuda.is_available() is False)"
    assert r.json["weakest_link"] is None  # only the GPU measured: too few links


def test_pcie_failing_mid_way_leaves_the_link_null_and_the_rest_of_the_report(monkeypatch):
    from starvecheck.core.status import Unavailable

    _fake_pcie(monkeypatch, None)
    from starvecheck.stages.pcie import stage as pcie

    def broken(plan, machine, progress, warn):
        raise Unavailable("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(pcie, "run", broken)
    r = run("doctor", "--only", "pad,pcie", "--step-ms", "100", "--quick", "--json", "-")
    assert r.exit_code == 0, r.stderr
    link = next(x for x in r.json["chain"] if x["link"] == "pcie")
    assert link["capacity_samples_per_s"] is None
    assert link["reason"] == "not measured: CUDA error: an illegal memory access was encountered"
    assert r.json["weakest_link"] == "gpu"


def test_pcie_link_without_cuda_says_why_from_the_real_stage():
    from starvecheck.stages.pcie import stage as pcie

    why = pcie.cuda_unavailable()
    if why is None:
        pytest.skip("a CUDA device is present")
    r = run("doctor", "--only", "pcie", "--step-ms", "100", "--json", "-")
    assert r.exit_code == 0, r.stderr
    link = next(x for x in r.json["chain"] if x["link"] == "pcie")
    assert link["capacity_samples_per_s"] is None and link["reason"] == f"not measured: {why}"


# --- the GPU step -------------------------------------------------------------------------


def test_gpu_step_needs_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    from starvecheck.core.status import Unavailable
    from starvecheck.stages.doctor import gpustep

    with pytest.raises(Unavailable, match="give --step-ms"):
        gpustep.measure(16, 2048, quick=True)


@pytest.mark.gpu
def test_gpu_step_is_measured_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    r = run("doctor", "--only", "pad,pcie", "--quick", "--json", "-")
    assert r.exit_code in (0, 1), r.stderr
    step = r.json["workload"]["step_ms"]
    assert step["source"] == "measured" and step["value"] > 0
    caveats = r.json["stages"][-1]["caveats"]
    assert any(c.startswith("step_ms measured: GPT-2 small") for c in caveats)
    if torch.cuda.is_bf16_supported():
        assert any("in bf16 autocast" in c for c in caveats), caveats
    # The pcie link is measured at one batch's own size: 16 x 2,048 tokens x 8 bytes.
    pcie = next(x for x in r.json["chain"] if x["link"] == "pcie")
    assert pcie["capacity_samples_per_s"] > 0 and "256KiB" in pcie["basis"], pcie


def test_a_dataset_that_cannot_be_read_stops_before_anything_is_measured(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "plain words"}\n')
    r = run("doctor", "--dataset", str(data), str(tmp_path))  # text, and no --tokenizer
    assert r.exit_code == 2 and "--tokenizer" in r.stderr and r.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]
    missing = run("doctor", "--tokenizer", str(tmp_path / "no-such-tokenizer"), str(tmp_path))
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1, missing.stderr


def test_plot_draws_the_chain_with_the_weakest_link_in_red(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    png = tmp_path / "chain.png"
    r = run("doctor", "--only", "pad", "--step-ms", "100", "--plot", str(png))
    assert r.exit_code == 0, r.stderr
    pixels = matplotlib.image.imread(str(png))[:, :, :3]
    red = (abs(pixels - [214 / 255, 39 / 255, 40 / 255]).max(axis=2) < 0.02).sum()
    assert red > 1000  # the weakest link's bar (the GPU here), drawn in red
    bad = run("doctor", "--only", "pad", "--plot", str(tmp_path / "no" / "x.png"))
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
