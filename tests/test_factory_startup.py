"""`loader --factory` on settings whose wait is worker start-up (new workers every
epoch, issue 57): the current settings are read first, and where start-up holds the
largest share of their wait the worker counts are read with their workers kept
(persistent_workers=True, start-up's own fix), so the count named feeds the loop once
they are kept; said in a caveat. Where a configuration was cut short, the budget asked
for is more than the one it was cut short in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starvecheck.advice.factory_unread import unread
from starvecheck.core.schema.loading import LoadStage
from starvecheck.inputs.factory import parse_spec
from starvecheck.loading.split import INDEX, STAGES
from starvecheck.stages.loader.factory import stage as factory_stage
from starvecheck.stages.loader.factory.load import Pipeline
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.rounds import read_rounds
from starvecheck.stages.loader.factory.run import Budget, Run
from starvecheck.stages.loader.factory.stagesplit import RunSplit


def _split(stage: LoadStage, share: float) -> RunSplit:
    exposed = [0.0] * len(STAGES)
    exposed[INDEX[stage]] = share
    exposed[INDEX[LoadStage.READ]] += 1.0 - share
    return RunSplit(exposed=exposed, busy=list(exposed), batches=10)


def _fake(startup_share: float, read: list[Config]):
    """A pipeline whose 2 workers, started every epoch, spend `startup_share` of their
    wait starting; kept, the workers deliver 100 samples/s each."""

    def measure_one(pipeline: Pipeline, config: Config, budget: Budget, device: object) -> Run:
        read.append(config)
        if config.workers and not config.persistent_workers:
            rate = 10.0 if startup_share > 0.5 else 60.0 * config.workers
        else:
            rate = 80.0 if not config.workers else 100.0 * config.workers
        r = Run(config, samples_per_s=[rate], window_s=1.0, window_samples=int(rate))
        r.samples, r.batches = int(rate), int(rate / 4)
        top = LoadStage.STARTUP if config.workers and not config.persistent_workers else None
        r.split = _split(top or LoadStage.READ, startup_share if top else 1.0)
        return r

    return measure_one


def _setup(tmp_path: Path) -> tuple[factory_stage.Plan, Pipeline]:
    spec = parse_spec(f"{tmp_path / 'x.py'}:make")
    plan = factory_stage.Plan(spec, 4, (0, 1, 2), True, 2, 3.0, 5.0, rounds=2)
    settings = {"batch_size": 4, "num_workers": 2, "prefetch_factor": 2}
    return plan, Pipeline(spec, object(), False, True, settings, length=64)


def test_given_readings_are_the_first_rounds_and_the_rest_read_on() -> None:
    read: list[int] = []

    def read_one(config: Config) -> Run:
        read.append(config.workers)
        return Run(config, samples_per_s=[10.0], window_s=1.0, window_samples=10)

    given = {Config(2, 2): Run(Config(2, 2), samples_per_s=[7.0], window_s=1.0, window_samples=7)}
    todo = [("workers", Config(0)), ("workers", Config(1)), ("workers", Config(2, 2))]
    runs = read_rounds(todo, 2, read_one, lambda _: None, given=given)
    assert read == [0, 1, 1, 2, 0]  # round 1 reads 0 and 1; round 2 turns, 2 read again
    assert {r.config.workers: r.samples_per_s for _, r in runs}[2] == [7.0, 10.0]


def test_start_up_bound_settings_have_the_counts_read_with_workers_kept(tmp_path: Path) -> None:
    plan, pipeline = _setup(tmp_path)
    read: list[Config] = []
    runs = factory_stage.sweep(pipeline, plan, lambda *a: None, _fake(0.95, read))
    now = Config(2, 2)
    assert read[0] == now  # the current settings first, their start-up seen
    assert read.count(now) == 2  # once a round, as themselves
    swept = [r.config for role, r in runs if role == "workers"]
    assert swept == [Config(0), Config(1, 2, True), Config(2, 2, True)]
    assert [role for role, r in runs if r.config == now] == ["current"]
    result = factory_stage.result(pipeline, plan, runs)
    assert result.has_caveat("loader.counts-kept")


def test_settings_not_start_up_bound_are_swept_as_they_are(tmp_path: Path) -> None:
    plan, pipeline = _setup(tmp_path)
    read: list[Config] = []
    runs = factory_stage.sweep(pipeline, plan, lambda *a: None, _fake(0.1, read))
    assert read[0] == Config(2, 2)
    assert not any(c.persistent_workers for c in read)
    assert read.count(Config(2, 2)) == 2  # read first, and not again in its first round
    assert [r.config for role, r in runs if role == "workers"][-1] == Config(2, 2)
    assert not factory_stage.result(pipeline, plan, runs).has_caveat("loader.counts-kept")


def test_kept_workers_are_swept_as_they_are(tmp_path: Path) -> None:
    plan, pipeline = _setup(tmp_path)
    pipeline.settings["persistent_workers"] = True
    read: list[Config] = []
    factory_stage.sweep(pipeline, plan, lambda *a: None, _fake(0.95, read))
    assert read[0] == Config(0)  # nothing to read ahead: no restarts to see


def test_the_budget_asked_for_a_cut_reading_is_more_than_it_was_cut_in(tmp_path: Path) -> None:
    plan, pipeline = _setup(tmp_path)
    # Start-up-bound slices: 2 batches in 0.05 s of windows, cut short at a 10 s budget.
    cut = Run(Config(4, 2), samples_per_s=[9.0], window_s=0.05, window_samples=8)
    cut.batches, cut.samples, cut.seconds, cut.partial = 2, 8, 0.05, True
    whole = Run(Config(0), samples_per_s=[400.0], window_s=1.0, window_samples=400)
    whole.batches, whole.samples, whole.seconds = 100, 400, 1.0
    from dataclasses import replace

    result = factory_stage.result(
        pipeline, replace(plan, budget_s=10.0), [("workers", whole), ("workers", cut)]
    )
    f = unread(result)
    assert f is not None
    assert "`--budget 20`" in f.recommendation, f.recommendation
    assert "0.0 minutes" not in f.recommendation


SLOW_START = """
import time
import torch

class Quick(torch.utils.data.Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        return torch.zeros(4)

def start(worker_id):
    time.sleep(0.4)  # each epoch's new worker: 0.4 s before its first sample

def make():
    return torch.utils.data.DataLoader(Quick(), batch_size=4, num_workers=1,
                                       worker_init_fn=start)
"""


def test_epochs_that_restart_inside_the_windows_are_read_as_whole_epochs(tmp_path: Path) -> None:
    from starvecheck.stages.loader.factory import configuration
    from starvecheck.stages.loader.factory.load import load
    from starvecheck.stages.loader.factory.loaders import current_config

    (tmp_path / "x.py").write_text(SLOW_START)
    pipeline = load(parse_spec(f"{tmp_path / 'x.py'}:make"), None, 20)
    run = configuration.measure(pipeline, current_config(pipeline), Budget(1.0, 20.0, False))
    # An epoch: 0.4 s of start-up and 8 fast batches, 32 samples: at most 80 samples/s.
    # A window closed a few batches past a restart read 20-40 (a restart, part of its
    # epoch); an epoch read whole, 60-80.
    assert run.epochs >= 2 and run.samples_per_s
    assert max(run.samples_per_s) <= 80.0, run.samples_per_s
    assert min(run.samples_per_s) >= 0.75 * 80.0 * 0.4 / (0.4 + 0.1), run.samples_per_s
    assert not run.partial


def test_an_epochs_figure_is_its_batches_pace_plus_one_restart() -> None:
    from starvecheck.stages.loader.factory.epochs import per_epoch

    # No restart read (a forkserver reading cut by its budget in its first epoch): the
    # first epoch's 1.5 s start-up stands for it. 20 batches of 4 in 1 s: 50 ms each.
    run = Run(Config(2, 2), window_s=1.0, window_batches=20, window_samples=80)
    run.first_batch_s, run.samples_per_s = 1.5, [80.0]
    per_epoch(run, [], 32)
    assert run.samples_per_s == [pytest.approx(4 * 32 / (1.5 + 31 * 0.05))]
    assert run.window_samples / run.window_s == pytest.approx(run.samples_per_s[0], rel=0.01)
    # A restart of 0.5 s read inside the windows: taken out of the pace, put back once.
    run = Run(Config(2, 2), window_s=1.5, window_batches=21, window_samples=84)
    run.first_batch_s = 9.0  # not used: a restart was read
    per_epoch(run, [0.5], 32)
    assert run.samples_per_s == [pytest.approx(4 * 32 / (0.5 + 31 * 0.05))]
    # Workers kept, or an epoch of unknown length: the windows' figure stands.
    for config, epoch in ((Config(2, 2, True), 32), (Config(2, 2), None)):
        run = Run(config, samples_per_s=[80.0], window_s=1.0, window_batches=20)
        run.window_samples = 80
        per_epoch(run, [], epoch)
        assert run.samples_per_s == [80.0]


STARTS_SLOWLY = """
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Carries(Dataset):
    # 32 MB carried (a table read in __init__): every forkserver worker unpickles it
    def __init__(self):
        self.table = bytes(32 << 20)
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.zeros(4)


def start(worker_id):
    time.sleep(0.5)  # and a slow start of its own, every epoch


def make():
    return DataLoader(Carries(), batch_size=4, num_workers=2, worker_init_fn=start,
                      multiprocessing_context="forkserver")
"""


@pytest.mark.slow
def test_the_command_names_persistent_workers_for_start_up_bound_settings(tmp_path: Path):
    from tests.conftest import run as run_cli

    (tmp_path / "starts.py").write_text(STARTS_SLOWLY)
    r = run_cli(
        "loader", "--factory", f"{tmp_path / 'starts.py'}:make", "--quick",
        "--workers", "0,2", "--step-ms", "10", "--json", "-",
    )  # fmt: skip
    assert r.exit_code in (0, 1), r.output
    stage = json.loads(r.stdout)["stages"][0]
    assert any("persistent_workers=True" in c for c in stage["caveats"]), stage["caveats"]
    (f,) = [f for f in stage["findings"] if f["id"] == "loader.own-config"]
    if f["title"].startswith("This machine is too busy to tell"):
        return  # other work in this lane: no count, its load said
    assert f["fix"].get("persistent_workers") is True, f
    assert f["fix"]["num_workers"] == 2
    roles = [(c["role"], c["config"]) for c in stage["parameters"]["configurations"]]
    assert roles[0] == ("current", "num_workers=2, prefetch_factor=2")


def test_rounds_read_on_while_the_count_called_enough_may_or_may_not_gain() -> None:
    from starvecheck.core.criteria import knee_settled
    from starvecheck.stages.loader.factory.settled import counts_settled

    # Collate under a CPU burner: 4 workers read fastest but past the 2 CPUs for CPU
    # work; 2 is the count called enough, and 1.10x (1.00x, 1.09x, 1.09x) over the
    # current settings: neither above 1.05x nor short of 1.10x.
    rates = {
        0: [300.0, 345.0, 330.0],
        1: [280.0, 285.0, 282.0],
        2: [330.0, 345.0, 360.0],
        4: [440.0, 442.0, 445.0],
    }
    runs = [
        ("workers", Run(Config(w, 2 if w else None), samples_per_s=v)) for w, v in rates.items()
    ]
    assert knee_settled(rates)  # every count settled against the best
    assert not counts_settled(runs, now=Config(0), cpus=2)
    assert counts_settled(runs)  # no current settings to gain on: the count settles it
    runs[0][1].samples_per_s = [250.0, 262.0, 255.0]  # 1.32x: clears, no more rounds
    rates[0] = runs[0][1].samples_per_s
    assert knee_settled(rates)
    assert counts_settled(runs, now=Config(0), cpus=2)


def test_a_median_under_the_margin_is_no_change_however_wide_its_interval() -> None:
    from starvecheck.core.paired import Comparison

    assert Comparison(1.10, 0.92, 1.31, 3).undecided()
    assert not Comparison(0.53, 0.25, 1.34, 3).undecided()  # slower by its median
    assert not Comparison(1.04, 0.90, 1.30, 3).undecided()  # under 1.05x by its median
    assert not Comparison(1.06, 1.03, 1.09, 3).undecided()  # nothing worth making inside
    assert not Comparison(1.30, 1.10, 1.50, 3).undecided()  # clears: a change
