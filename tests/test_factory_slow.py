"""loader --factory on a dataset too slow for windows in its budget (made.py,
slowread.py): its rate read from when its batches were made, rounds that stop once they
settle the answer (criteria.knee_settled, variants_settled), and never a pass on a
configuration cut short (advice/factory_unread.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from starvecheck.core.criteria import knee_settled, variants_settled
from starvecheck.stages.loader.factory.made import Made, too_slow
from tests.conftest import run as run_cli


def test_windows_that_would_outlast_the_slice_are_too_slow():
    # 2 workers at prefetch 2: 5 warm-up + 5 drained + 8 in a window = 18 batches, 9 batch
    # times at 2 workers; a 1.6 s batch is 14.4 s, a 10 ms one 0.09 s.
    assert too_slow(1.6, 2, None, 1.0) and too_slow(1.6, 2, None, 14.0)
    assert not too_slow(1.6, 2, None, 15.0) and not too_slow(0.01, 2, None, 1.0)
    assert too_slow(1.6, 0, None, 1.0)  # in the training process: 1 + 1 + 2 batches


def test_the_rate_is_the_batches_made_after_every_workers_first():
    m = Made()
    # two workers, each a batch a second, their firsts at 1.0 and 1.2 s
    for w, t in ((0, 1.0), (1, 1.2), (0, 2.0), (1, 2.2), (0, 3.0)):
        m.add(w, t, 1.0)
    assert m.first_work_s == 1.0
    assert m.enough(2, 1) and not m.enough(2, 2)  # worker 1 made one past 1.2 s
    per_second, n, span = m.rate(2) or (0, 0, 0)
    assert n == 3 and span == pytest.approx(1.8) and per_second == pytest.approx(3 / 1.8)
    alone = Made()
    for t in (1.6, 3.2, 4.8):
        alone.add(-1, t, 1.6)
    assert alone.enough(0, 2) and alone.rate(0) == (pytest.approx(2 / 3.2), 2, pytest.approx(3.2))
    assert Made().rate(2) is None and not Made().enough(1)


def test_a_sweep_is_settled_once_every_count_is_clearly_slower_or_as_good_as_the_best():
    assert knee_settled({0: [10, 10], 1: [10, 10.1], 2: [20, 20]})
    assert not knee_settled({0: [10, 10], 2: [20, 20], 4: [19, 21.5]})  # 4 against 2: unclear
    assert knee_settled({0: [10, 10, 10], 2: [20, 20.2, 19.9], 4: [20.1, 20, 20]})
    assert not knee_settled({0: [10], 2: [20]})  # one round: no interval
    assert variants_settled([[40, 40.1]], [40, 40.2])  # as fast: does not join, surely
    assert variants_settled([[50, 50.5]], [40, 40.2])  # joins, surely
    assert not variants_settled([[42, 46]], [40, 40.2])  # the margin inside its interval


SLEEPY = """
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Sleepy(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.zeros(4)


def make():
    return DataLoader(Sleepy(), batch_size=8)
"""


@pytest.mark.slow
def test_quick_on_a_slow_read_names_the_workers_it_gains_never_a_pass(tmp_path: Path):
    # 50 ms a sample (a read: no CPU), 8 a batch: 0.4 s a batch in the training process,
    # too slow for --quick's windows; two workers read it twice as fast, whatever the
    # machine's load (sleeping needs no CPU).
    (tmp_path / "slowread.py").write_text(textwrap.dedent(SLEEPY))
    r = run_cli(
        "loader", "--factory", f"{tmp_path / 'slowread.py'}:make", "--quick",
        "--workers", "0,2", "--json", "-",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    stage = json.loads(r.stdout)["stages"][0]
    (f,) = [f for f in stage["findings"] if f["id"] == "loader.own-config"]
    assert f["severity"] != "ok"
    assert f["fix"] == {"num_workers": 2}
    assert 1.6 <= f["gain"]["value"] <= 2.4
    assert stage["parameters"]["rounds"] <= 3


@pytest.mark.slow
def test_a_configuration_cut_short_is_could_not_tell_never_a_pass(tmp_path: Path):
    (tmp_path / "slowread.py").write_text(textwrap.dedent(SLEEPY).replace("0.05", "0.2"))
    r = run_cli(
        "loader", "--factory", f"{tmp_path / 'slowread.py'}:make", "--quick",
        "--workers", "0,1", "--budget", "0.5", "--json", "-",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    stage = json.loads(r.stdout)["stages"][0]
    (f,) = [f for f in stage["findings"] if f["id"] == "loader.own-config"]
    # Never a pass nor a count: cut short, it could not tell (and says what --budget
    # reads it whole); where other work kept the CPUs busy (this lane under xdist), the
    # machine was too busy to tell, which takes precedence.
    assert "fix" not in f and f["severity"] != "ok"
    if f["title"].startswith("This machine is too busy to tell"):
        return
    assert f["severity"] == "warning" and f["title"].startswith("Could not tell")
    assert "--budget" in f["recommendation"]


def test_a_slow_configuration_does_not_wait_for_the_batch_its_workers_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Read by when its batches were made, a configuration's stop waited for the batch
    # each worker had in hand: 1.6 s at each of --quick's four worker readings at 100 ms
    # a sample and batch 16. Its reading now hurries the stop (Batches.hurry).
    from starvecheck.inputs.factory import parse_spec
    from starvecheck.stages.dataloader.batches import Batches
    from starvecheck.stages.loader.factory import configuration, load

    (tmp_path / "slowmade.py").write_text(textwrap.dedent(SLEEPY))
    hurried: list[int] = []
    monkeypatch.setattr(Batches, "hurry", lambda self: hurried.append(self.workers))
    p = load.load(parse_spec(f"{tmp_path / 'slowmade.py'}:make"), None, limit_s=60)
    slice_ = configuration.Budget(0.2, 30.0, False, 1)
    run = configuration.measure(p, configuration.Config(1), slice_)
    assert run.stopped == "made" and run.made
    assert hurried == [1]
    run = configuration.measure(p, configuration.Config(0), slice_)
    assert run.stopped == "made" and hurried == [1, 0]  # nothing to stop: torch's own end
