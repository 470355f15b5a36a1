"""`watch` checks the data, not only its speed: ranks that train on the same batches
(a shuffled DataLoader with one seed on every rank, no DistributedSampler), and a
shuffling DistributedSampler whose `set_epoch` is never called. Real ranks: torchrun on
this machine, gloo on loopback; and the digests' exchange through the store's encoding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starvecheck.advice.report import build_report
from starvecheck.core.context import Context
from starvecheck.loop import ranks
from starvecheck.loop.ranks import Gathered
from starvecheck.loop.samples import DIGESTED, FirstBatches, shared
from starvecheck.loop.timer import Watch
from starvecheck.loop.times import LoopTimes, RankTimes
from tests.test_watch_ranks import torchrun

JOB = """
import json, sys, torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
import starvecheck

dist.init_process_group("gloo")
mode, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)  # one seed on every rank, as a script without a per-rank seed has
data = TensorDataset(torch.arange(512, dtype=torch.float32).reshape(512, 1))
sampler = DistributedSampler(data, shuffle=True) if mode != "plain" else None
loader = DataLoader(data, batch_size=8, shuffle=sampler is None, sampler=sampler)
w = starvecheck.watch(loader, show=False)
for epoch in range(2):
    if mode == "sampler":
        sampler.set_epoch(epoch)
    for (x,) in w:
        dist.all_reduce(x.sum())
stage = w.result()
if dist.get_rank() == 0:
    json.dump(stage.to_dict(), open(out, "w"))
dist.destroy_process_group()
"""


def run_job(tmp_path: Path, mode: str) -> dict:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / f"{mode}.json"
    p = torchrun(str(script), mode, str(out), timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def ids(stage: dict) -> set[str]:
    return {f["id"] for f in stage["findings"]}


@pytest.mark.slow
def test_two_ranks_without_a_distributed_sampler_are_flagged(tmp_path: Path) -> None:
    stage = run_job(tmp_path, "plain")
    assert "watch.ranks-same-batches" in ids(stage), ids(stage)
    assert stage["parameters"]["ranks_same_share"] == 1.0
    assert stage["parameters"]["ranks_samples_compared"] == 8 * DIGESTED


@pytest.mark.slow
def test_with_a_distributed_sampler_and_set_epoch_nothing_is_flagged(tmp_path: Path) -> None:
    stage = run_job(tmp_path, "sampler")
    found = ids(stage)
    assert "watch.ranks-same-batches" not in found and "watch.set-epoch" not in found
    assert stage["parameters"]["ranks_same_share"] == 0.0
    assert stage["parameters"]["same_order_passes"] is False


@pytest.mark.slow
def test_a_distributed_sampler_without_set_epoch_is_flagged(tmp_path: Path) -> None:
    stage = run_job(tmp_path, "no-set-epoch")
    found = ids(stage)
    assert "watch.set-epoch" in found and "watch.ranks-same-batches" not in found, found
    f = next(f for f in stage["findings"] if f["id"] == "watch.set-epoch")
    assert "set_epoch" in f["recommendation"] and "stayed 0" in f["evidence"]


def test_one_process_two_passes_in_the_same_order_from_a_shuffling_sampler() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    data = TensorDataset(torch.arange(64, dtype=torch.float32).reshape(64, 1))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True)
    w = Watch(DataLoader(data, batch_size=4, sampler=sampler), show=False)
    for _ in range(2):
        for _ in w:
            pass
    assert w.times.same_order() is True and w.times.sampler_epochs == [0, 0]
    assert "watch.set-epoch" in {f.id for f in w.result().findings}
    sampler.set_epoch(1)
    for _ in w:
        pass
    assert w.times.same_order() is False
    assert "watch.set-epoch" not in {f.id for f in w.result().findings}


def test_digests_travel_with_a_ranks_figures_and_are_compared_on_rank_0() -> None:
    def loop(values: list[int]) -> LoopTimes:
        t = LoopTimes(waits=[0.05, 0.001], computes=[0.01, 0.01], wait_cpu=[0, 0],
                      compute_cpu=[0, 0], passes=1)  # fmt: skip
        t.digests = {1: values}
        return t

    a, b = loop(list(range(32))), loop(list(range(32)))
    sent = {r: RankTimes.decode(t.encode(rank=r, final=True, window=ranks.WINDOW))
            for r, t in ((0, a), (1, b))}  # fmt: skip
    assert sent[1].times.digests == {1: list(range(32))}
    stage = ranks.combine(a, 0, Gathered(sent, 2))
    assert stage.parameters["ranks_same_share"] == 1.0
    report = build_report("watch", None, [stage], Context())
    assert "watch.ranks-same-batches" in {f.id for f in report.stages[0].findings}
    assert shared({0: [1, 2, 3, 4], 1: [5, 6, 7, 8]}) == (0.0, 4)
    assert shared({0: [1, 2], 1: []}) is None


def test_a_batch_that_cannot_be_digested_is_counted_and_never_raises() -> None:
    class Odd:
        @property
        def shape(self) -> tuple[int, ...]:
            raise RuntimeError("no")

    t = LoopTimes(passes=1)
    first = FirstBatches(t, object())
    for item in (Odd(), {"x": 3}, [Odd()]):
        first.read(item)
    assert t.digest_gaps == 3 and t.digests[1] == []
