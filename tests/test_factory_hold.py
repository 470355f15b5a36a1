"""`loader --factory` on pipelines as people build them, on a machine that is not quiet:
each defect a user met, with a real DataLoader (and WebDataset's WebLoader).

- configurations are read in interleaved rounds, each round in another order, and
  compared round by round;
- workers waiting for a CPU another process holds are CPU work, never I/O: no count past
  the CPUs for it, even while another process burns a core;
- at num_workers=0 loading and the step take turns: never "keeps up" against --step-ms;
- a loader-like object (WebLoader, a DataPipeline around a DataLoader) is read as it is
  and its inner DataLoader swept: never batched again, never workers inside workers;
- a generator is read as it is, and said to be;
- a DataLoader of pre-batched samples (batch_size=None) keeps its shuffling sampler.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from starvecheck.inputs.factory import parse_spec
from starvecheck.stages.loader.factory import loaders
from starvecheck.stages.loader.factory import stage as factory_stage
from starvecheck.stages.loader.factory.load import load
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.rounds import merge
from starvecheck.stages.loader.factory.run import Budget, Run

PIPES = textwrap.dedent(
    """
    import io, tarfile, numpy as np, torch
    from torch.utils.data import DataLoader, Dataset

    class Busy(Dataset):
        '''CPU work in Python, about 2 ms a sample: tokenizing, decoding.'''
        def __len__(self):
            return 4096
        def __getitem__(self, i):
            x = 0
            for k in range(30_000):
                x += k * k
            return torch.tensor([x % 7], dtype=torch.float32)

    def busy():
        return DataLoader(Busy(), batch_size=8, shuffle=True)

    class Prebatched(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.full((16, 4), float(i))

    def prebatched():
        return DataLoader(Prebatched(), batch_size=None, shuffle=True)

    def generator():
        for i in range(200):
            yield torch.zeros(16, 8)
    """
)


@pytest.fixture
def pipes(tmp_path: Path) -> Path:
    path = tmp_path / "pipes.py"
    path.write_text(PIPES)
    return path


def cli(*argv: str, timeout: float = 240) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "starvecheck", "loader", *argv, "--json", "-"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert r.returncode in (0, 1), r.stderr
    assert "daemonic" not in r.stderr
    return json.loads(r.stdout)["stages"][0]


def findings(stage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["id"]: f for f in stage["findings"]}


# --- rounds ---------------------------------------------------------------------------


def test_configurations_are_read_in_rounds_each_in_another_order(pipes: Path) -> None:
    p = load(parse_spec(f"{pipes}:busy"), None, 20)
    order: list[int] = []

    def measure_one(pl: Any, config: Config, budget: Budget, device: Any) -> Run:
        order.append(config.workers)
        # 1 and 2 workers too close to tell apart in two rounds: every round is read
        n = (
            100 * (config.workers + 1)
            if config.workers < 2
            else (190, 210, 200)[order.count(2) % 3]
        )
        r = Run(config, window_s=1.0, window_samples=n)
        r.samples = r.window_samples
        return r

    plan = factory_stage.Plan(
        spec=p.spec, batch_size=None, workers=(0, 1, 2), quick=False, effective_cpus=2,
        budget_s=3.0, batch_timeout_s=30.0, rounds=3,
    )  # fmt: skip
    runs = factory_stage.sweep(p, plan, lambda *a: None, measure_one)
    first = order[:9]
    assert [first[0:3], first[3:6], first[6:9]] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    rates = {r.config.workers: r.samples_per_s for role, r in runs if role == "workers"}
    assert rates[2] == [210.0, 200.0, 190.0]  # one figure a round, in round order
    # The variants at the count chosen (2) are read beside it, in rounds of their own,
    # and the current configuration (num_workers=0) again beside them.
    assert [role for role, _ in runs[3:]] == ["base", "prefetch", "persistent", "again"]
    # (their figures settle which variants join in two rounds: no third is read)
    assert runs[-1][1].config.workers == 0 and runs[-1][1].samples_per_s == [100.0] * 2


def test_quick_reads_the_counts_only_and_says_the_full_run_judges_the_rest(pipes: Path) -> None:
    # One quick run of three took prefetch_factor=4 at 1.15x where the full run did not:
    # three rounds cannot tell a setting second to the count from the noise.
    p = load(parse_spec(f"{pipes}:busy"), None, 20)

    def measure_one(pl: Any, config: Config, budget: Budget, device: Any) -> Run:
        r = Run(config, window_s=1.0, window_samples=100 * (config.workers + 1))
        r.samples = r.window_samples
        return r

    plan = factory_stage.Plan(
        spec=p.spec, batch_size=None, workers=(0, 1, 2), quick=True, effective_cpus=2,
        budget_s=3.0, batch_timeout_s=30.0,
    )  # fmt: skip
    runs = factory_stage.sweep(p, plan, lambda *a: None, measure_one)
    assert [role for role, _ in runs] == ["workers"] * 3
    stage = factory_stage.result(p, plan, runs)
    assert [c.id for c in stage.caveats] == ["loader.quick-counts"]
    full = factory_stage.result(p, replace(plan, quick=False), runs)
    assert [c.id for c in full.caveats] == ["loader.no-pin"]


def test_merging_slices_keeps_one_figure_a_round_and_adds_the_rest() -> None:
    slices = [
        Run(Config(2), window_s=2.0, window_samples=200, samples=200, main_cpu_s=0.1),
        Run(Config(2), window_s=1.0, window_samples=300, samples=300, main_cpu_s=0.2),
    ]
    m = merge(slices)
    assert m.samples_per_s == [100.0, 300.0] and m.samples == 500
    assert m.main_cpu_s == pytest.approx(0.3) and m.stopped == "rounds"


# --- workers waiting for a CPU are CPU work -------------------------------------------


@pytest.mark.accuracy
def test_while_another_process_burns_a_core_cpu_work_stays_within_the_cpus(pipes: Path) -> None:
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        stage = cli("--factory", f"{pipes}:busy", "--workers", "0,1,2,4", "--budget", "3")
    finally:
        burner.kill()
        burner.wait()
    own = findings(stage)["loader.own-config"]
    if "too busy to tell" in own["title"]:  # more work elsewhere too: no count, its load said
        assert not own.get("fix") and "of the 2 CPUs busy" in own["title"]
    else:
        assert own["fix"]["num_workers"] <= 2
    assert "I/O" not in own["recommendation"] and "blocked" not in own["recommendation"]
    # What the workers did with their time, measured: waiting for a CPU, not blocked.
    waited = [
        m["value"]
        for m in stage["metrics"]
        if m["labels"].get("quantity") == "runq_ms_per_sample"
        and m["labels"].get("workers") == 4
        and m["labels"].get("process") == "workers"
    ]
    assert waited and waited[0] > 0
    # The other process's load is seen and said.
    assert any("other processes kept" in c for c in stage["caveats"])


# --- num_workers=0 and the step take turns ----------------------------------------------


@pytest.mark.slow
def test_at_num_workers_0_the_gpu_waits_for_every_batch(pipes: Path) -> None:
    stage = cli("--factory", f"{pipes}:busy", "--workers", "0", "--step-ms", "30", "--quick")
    demand = findings(stage)["loader.own-demand"]
    assert demand["severity"] in ("warning", "critical")
    assert demand["title"].startswith("At num_workers=0 the GPU waits for every batch")
    assert "take turns" in demand["evidence"]


# --- pipelines as people build them -----------------------------------------------------


def _shard(path: Path, n: int) -> None:
    from PIL import Image

    with tarfile.open(path, "w") as tar:
        for i in range(n):
            out = io.BytesIO()
            Image.new("RGB", (64, 48), (i % 255, 10, 20)).save(out, "JPEG")
            for ext, data in (("jpg", out.getvalue()), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


WEBLOADER = textwrap.dedent(
    """
    import glob, torch, webdataset as wds

    def _dataset(root):
        urls = sorted(glob.glob(root + "/shard-*.tar"))
        to_tensor = lambda im: torch.from_numpy(__import__("numpy").asarray(im).copy())
        return (
            wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
            .decode("pil").to_tuple("jpg", "cls").map_tuple(to_tensor, int).batched(8)
        )

    def webloader():
        return wds.WebLoader(_dataset(ROOT), batch_size=None, num_workers=0)
    """
)


@pytest.mark.slow
def test_a_webloader_is_read_as_it_is_and_its_inner_dataloader_swept(tmp_path: Path) -> None:
    pytest.importorskip("webdataset")
    for s in range(2):
        _shard(tmp_path / f"shard-{s:04d}.tar", 160)
    path = tmp_path / "web.py"
    path.write_text(WEBLOADER.replace("ROOT", repr(str(tmp_path))))
    stage = cli("--factory", f"{path}:webloader", "--workers", "0,2", "--quick")
    p = stage["parameters"]
    assert p["dataset"].startswith("WebLoader around a DataLoader of")
    # Its batches of 8 images, counted as 8 samples each: never batched again.
    batch = next(m for m in stage["metrics"] if m["labels"].get("quantity") == "batch_bytes")
    assert batch["value"] < 8 * 64 * 48 * 3 * 1.5
    swept = {m["labels"]["workers"] for m in stage["metrics"] if m["labels"]["role"] == "workers"}
    assert swept == {0, 2}
    assert "loader.own-config" in findings(stage)


@pytest.mark.slow
def test_a_generator_is_read_as_it_is_and_said_to_be(pipes: Path) -> None:
    stage = cli("--factory", f"{pipes}:generator", "--quick")
    own = findings(stage)["loader.own-config"]
    assert own["title"].startswith("Your loader was read as it is")
    assert stage["parameters"]["read_as_is"] is True
    assert {m["labels"]["role"] for m in stage["metrics"] if "role" in m["labels"]} == {"current"}


def test_a_dataloader_of_prebatched_samples_keeps_its_sampler(pipes: Path) -> None:
    p = load(parse_spec(f"{pipes}:prebatched"), None, 20)
    assert p.settings["batch_size"] is None
    assert type(p.settings["sampler"]).__name__ == "RandomSampler"
    built = loaders.make_loader(p, Config(0))
    batches: Iterator[Any] = iter(built.loader)
    first = next(batches)
    assert tuple(first.shape) == (16, 4)  # one pre-batched sample, not a batch of them
