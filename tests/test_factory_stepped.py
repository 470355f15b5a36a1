"""`loader --factory --step-ms`: the count called enough and the current settings read
again with the step as a sleep after every batch (stages/loader/factory/stepped.py), and
the finding's training figure their ratio, round by round, where the change it names
is that count (advice/factory_bounds.stepped_gain); the model elsewhere."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from starvecheck.advice.factory import rules
from starvecheck.advice.factory_bounds import stepped_gain
from starvecheck.advice.results import Results
from starvecheck.core.model import GainKind
from starvecheck.core.schema.factory import Parameters as FactoryParameters
from starvecheck.core.schema.factory import StepRead
from starvecheck.inputs.factory import parse_spec
from starvecheck.stages.loader.factory import configuration
from starvecheck.stages.loader.factory import stage as factory_stage
from starvecheck.stages.loader.factory.load import Pipeline, load
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.run import Budget, Run
from starvecheck.stages.loader.factory.spare import Tally
from starvecheck.stages.loader.factory.stepped import STEP_ROUNDS, read_with_step


def _fake(read: list[tuple[Config, float]], stepped_gain: float = 1.3):
    """Workers that load 100 samples/s each at most 2 (0: 80); read with a step, the
    count's gain over the current settings (2 workers... 1 worker) is `stepped_gain`."""

    def measure_one(pipeline: Pipeline, config: Config, budget: Budget, device: object) -> Run:
        read.append((config, budget.step_s))
        rate = 80.0 if not config.workers else 100.0 * min(config.workers, 2)
        if budget.step_s:
            rate = 50.0 * (stepped_gain if config.workers == 2 else 1.0)
        r = Run(config, samples_per_s=[rate], window_s=1.0, window_samples=int(rate))
        r.samples, r.batches = int(rate), int(rate / 4)
        return r

    return measure_one


def _setup(tmp_path: Path, step_ms: float | None, quick: bool = False):
    spec = parse_spec(f"{tmp_path / 'x.py'}:make")
    plan = factory_stage.Plan(spec, 4, (0, 1, 2, 4), quick, 2, 3.0, 5.0, rounds=2)
    plan = replace(plan, step_ms=step_ms)
    settings = {"batch_size": 4, "num_workers": 1, "prefetch_factor": 2}
    return plan, Pipeline(spec, object(), False, True, settings, length=4096)


def _swept(tmp_path: Path, step_ms: float | None):
    """The fake pipeline swept: (plan, pipeline, runs, what was read with which step,
    the step's readings)."""
    plan, pipeline = _setup(tmp_path, step_ms)
    read: list[tuple[Config, float]] = []
    stepped: list[StepRead] = []
    runs = factory_stage.sweep(pipeline, plan, lambda *a: None, _fake(read), stepped=stepped)
    return plan, pipeline, runs, read, stepped


def test_the_count_and_the_current_settings_are_read_with_the_step_in_rounds(
    tmp_path: Path,
) -> None:
    _, _, _, read, stepped = _swept(tmp_path, 20.0)
    with_step = [(c, s) for c, s in read if s]
    now, count = Config(1, 2), Config(2, 2)
    rounds = STEP_ROUNDS[False]
    assert sorted(c.workers for c, _ in with_step) == [1] * rounds + [2] * rounds
    assert all(s == pytest.approx(0.020) for _, s in with_step)
    assert read[-2 * rounds :] == with_step  # after the sweep, none of it with the step
    assert {c for c, _ in with_step} == {now, count}
    (got,) = stepped
    assert got.key == (2, 2, False, False) and got.step_ms == 20.0
    assert got.current == (50.0,) * rounds and got.changed == pytest.approx((65.0,) * rounds)


def test_no_step_no_reading_with_it(tmp_path: Path) -> None:
    _, _, _, read, stepped = _swept(tmp_path, None)
    assert stepped == [] and not any(s for _, s in read)


def test_where_the_count_called_enough_is_the_current_one_nothing_is_read_again() -> None:
    read: list[Config] = []

    def read_one(config: Config, budget: Budget) -> Run:
        read.append(config)
        return Run(config, samples_per_s=[1.0], window_s=1.0, window_samples=1)

    runs = [
        ("workers", Run(Config(0), samples_per_s=[50.0, 50.0])),
        ("workers", Run(Config(2), samples_per_s=[100.0, 100.0])),
    ]
    plan = _plan(20.0)
    budget = Budget(1.0, 5.0)
    tally = Tally(0)
    assert read_with_step(runs, Config(2), plan, budget, read_one, print, tally) == []
    assert read == [] and tally.total == 0
    # A count read by when its batches were made (too slow for windows): no step reading.
    runs[1][1].made = True
    assert read_with_step(runs, Config(0), plan, budget, read_one, print, tally) == []
    assert read == []
    # Counts read with their workers kept where the current settings restart theirs
    # every epoch (start-up-bound): more than the count changes, the model stands.
    runs[1][1].made = False
    kept = [("workers", Run(Config(w, 2, True), samples_per_s=[r, r])) for w, r in ((1, 5), (4, 9))]
    assert read_with_step(kept, Config(2, 2), plan, budget, read_one, print, tally) == []
    assert read == []
    # The same counts as the current settings' own (none kept): read with the step.
    assert read_with_step(runs, Config(0), plan, budget, read_one, print, tally) != []
    assert sorted(c.workers for c in read) == [0, 0, 0, 2, 2, 2]


def _plan(step_ms: float) -> Any:
    spec = parse_spec("/nowhere/x.py:make")
    return replace(factory_stage.Plan(spec, 4, (0, 2), False, 2, 3.0, 5.0), step_ms=step_ms)


def test_a_reading_sleeps_the_step_after_each_batch_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configuration.measure with Budget.step_s: one sleep of the step a counted batch
    (none in the warm-up); with 0, none."""
    slept: list[float] = []
    monkeypatch.setattr(configuration.clocks, "sleep", slept.append)
    (tmp_path / "x.py").write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "def make():\n"
        "    return DataLoader(torch.arange(64.0), batch_size=4)\n"
    )
    pipeline = load(parse_spec(f"{tmp_path / 'x.py'}:make"), None, limit_s=60)
    run = configuration.measure(pipeline, Config(0), Budget(0.5, 5.0, step_s=0.02))
    assert run.batches > 0
    assert slept and set(slept) == {0.02}
    assert len(slept) in (run.batches, run.batches - 1)  # none after the last, once stopped
    slept.clear()
    configuration.measure(pipeline, Config(0), Budget(0.5, 5.0))
    assert slept == []


def _params(step_read: list[StepRead], step_ms: float | None = 20.0) -> FactoryParameters:
    return FactoryParameters({"step_ms": step_ms, "step_read": [r.to_dict() for r in step_read]})


class _Settings:
    def __init__(self, key: tuple[int, int, bool, bool], start: str | None = None) -> None:
        self.key, self.start_method = key, start


class _Point:
    def __init__(self, key: tuple[int, int, bool, bool], start: str | None = None) -> None:
        self.settings = _Settings(key, start)


def test_the_training_figure_is_the_step_reading_where_it_is_the_change_named() -> None:
    read = StepRead(2, 2, step_ms=20.0, current=(50.0, 52.0, 51.0), changed=(80.0, 78.0, 82.0))
    got = stepped_gain(_params([read]), _Point((2, 2, False, False)))  # type: ignore[arg-type]
    assert got is not None and got.rounds == 3
    assert got.ratio == pytest.approx(80.0 / 52.0, rel=0.05)
    # Another configuration named (a variant at the count, another count): the model.
    assert stepped_gain(_params([read]), _Point((2, 2, True, False))) is None  # type: ignore[arg-type]
    assert stepped_gain(_params([read]), _Point((4, 2, False, False))) is None  # type: ignore[arg-type]
    assert stepped_gain(_params([read]), _Point((2, 2, False, False), "spawn")) is None  # type: ignore[arg-type]
    assert stepped_gain(_params([]), _Point((2, 2, False, False))) is None  # type: ignore[arg-type]


def test_a_stored_step_reading_that_does_not_read_as_one_is_left_out() -> None:
    params = FactoryParameters({"step_read": [{"workers": "two"}, 3, {"current": [1.0]}]})
    assert params.step_read == ()


def test_the_finding_gives_the_step_readings_figure_and_says_it_was_measured(
    tmp_path: Path,
) -> None:
    plan, pipeline, runs, _, stepped = _swept(tmp_path, 20.0)
    out = factory_stage.result(pipeline, plan, runs, (), stepped)
    (f,) = [f for f in rules(Results({"factory": out})) if f.id == "loader.own-config"]
    assert f.fix["num_workers"] == 2
    assert f.gain is not None and f.gain.kind is GainKind.THROUGHPUT
    assert f.gain.value == pytest.approx(1.3, abs=0.01)  # the step reading, not the model's
    assert "measured: the two read again with your 20 ms step" in f.gain.basis


SLEEPS = """
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Sleeps(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.zeros(4)


def make():
    return DataLoader(Sleeps(), batch_size=4)
"""


@pytest.mark.slow
def test_the_command_reads_the_change_with_the_step_and_gives_that_figure(tmp_path: Path):
    """A sleeping read of 16 ms a batch at num_workers=0 and a 20 ms step: 2 workers
    hide the read behind the step (37 -> 22 ms a step here, 1.7x); the step's reading is in
    the JSON, and the finding's training figure is its ratio, said to be measured."""
    import json

    from tests.conftest import run as run_cli

    (tmp_path / "sleeps.py").write_text(SLEEPS)
    r = run_cli(
        "loader", "--factory", f"{tmp_path / 'sleeps.py'}:make", "--quick",
        "--workers", "0,2", "--step-ms", "20", "--json", "-",
    )  # fmt: skip
    assert r.exit_code in (0, 1), r.output
    stage = json.loads(r.stdout)["stages"][0]
    (read,) = stage["parameters"]["step_read"]
    assert read["workers"] == 2 and read["step_ms"] == 20.0
    assert len(read["current"]) == len(read["changed"]) == STEP_ROUNDS[True]
    (f,) = [f for f in stage["findings"] if f["id"] == "loader.own-config"]
    assert f["fix"]["num_workers"] == 2
    assert "measured: the two read again with your 20 ms step" in f["gain"]["basis"]
    # Sleeps need no CPU: whatever else runs in the lane, 2 workers hide most of the read.
    assert 1.4 <= f["gain"]["value"] <= 2.0, f["gain"]
