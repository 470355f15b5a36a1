"""loader --factory's stage split and start method: each configuration's batches' wait
by stage (stages/loader/factory/stagesplit.py), the dataset's pickle
(startmethod.pickled), and `loader.start-method` judged on runs built by hand (the
count under the other start method, read beside it round by round)."""

from __future__ import annotations

import pickle
import time

import pytest

from starvecheck.advice import startmethod
from starvecheck.advice.results import Results
from starvecheck.core.catalogue import LOADER_START_METHOD
from starvecheck.core.metric import select
from starvecheck.core.schema.loading import EXPOSED_SHARE, STARTUP_S, LoadStage
from starvecheck.loading.split import STAGES
from starvecheck.loading.tap import Startup
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.stagesplit import RunSplit
from starvecheck.stages.loader.factory.startmethod import other_method, pickled
from tests.test_factory_advice import run, stage


def split_of(read: float, handover: float, startup: float | None = None) -> RunSplit:
    s = RunSplit(counting_from=0)
    exposed = [0.0] * len(STAGES)
    exposed[STAGES.index(LoadStage.READ)] = read
    exposed[STAGES.index(LoadStage.HANDOVER)] = handover
    s.put(0, exposed, exposed, read)
    if startup is not None:
        s.startups.append(Startup(startup, startup, startup * 0.8, 0.001, 2))
    return s


def test_a_configurations_split_is_summed_from_its_windows_only():
    s = RunSplit()
    one = [1.0] + [0.0] * (len(STAGES) - 1)
    s.put(0, one, one, 1.0)  # before the windows: not counted
    s.counting_from = 1
    s.put(1, one, one, 1.0)
    s.put(2, one, one, 1.0)
    assert s.batches == 2 and s.exposed[0] == 2.0
    both = s.merged(s)
    assert both.batches == 4 and both.solo == 4.0


def test_a_configurations_shares_are_its_metrics():
    r = run(Config(2), 100.0, 1.0)
    r.split = split_of(0.03, 0.01, startup=1.5)
    m = stage([("workers", r)], Config(2)).metrics
    shares = {x.labels["load_stage"]: x.value for x in select(m, quantity=EXPOSED_SHARE)}
    assert shares["read"] == pytest.approx(0.75) and shares["handover"] == pytest.approx(0.25)
    assert select(m, quantity=STARTUP_S)[0].values == (1.5,)


def test_the_dataset_is_pickled_into_a_count_bounded_in_time_and_size():
    blob = bytes(1 << 20)
    got = pickled({"table": blob})
    assert got.nbytes is not None and got.nbytes >= 1 << 20 and got.error is None
    assert pickled(blob, cap=1000).nbytes is None  # past its size: stopped, said

    class Slow:
        def __reduce__(self):
            time.sleep(0.3)
            return (list, ())

    slow = pickled([Slow()] * 5, limit_s=0.1)
    assert slow.nbytes is None and "still pickling past" in (slow.error or "")
    bad = pickled(lambda: None)
    assert bad.nbytes is None and bad.error and "pickle" in bad.error.lower()
    assert pickle.dumps(1)  # the module's own pickle left alone


def test_the_other_method_is_forkserver_for_a_forking_pipeline_and_fork_otherwise():
    assert other_method("fork") == "forkserver"
    assert other_method("spawn") == "fork"
    assert other_method("forkserver") == "fork"


def judged(runs, params):
    result = stage(runs, Config(0))
    result = type(result)(
        "factory", parameters={**dict(result.parameters), **params}, metrics=result.metrics
    )
    return startmethod.rules(Results({"factory": result}))


def test_a_forking_pipeline_is_told_what_forkserver_costs_it():
    base = run(Config(2), 400.0, 1.0)
    base.split = split_of(0.01, 0.001, startup=0.03)
    slow = run(Config(2, context="forkserver"), 100.0, 1.0)
    slow.split = split_of(0.01, 0.001, startup=3.5)
    (f,) = judged(
        [("base", base), ("start", slow)],
        {"start_method": "fork", "dataset_pickle_bytes": 200_000_000},
    )
    assert f.id == LOADER_START_METHOD and f.severity.value == "warning"
    assert "Python 3.14" in f.title and "0.25x" in f.title
    assert "3.50 s after each epoch began under forkserver" in f.evidence
    assert "200.0 MB" in f.evidence and "persistent_workers=True" in f.recommendation
    assert f.gain is not None and f.gain.value == pytest.approx(4.0)


def test_a_pipeline_as_fast_under_forkserver_is_told_so():
    (f,) = judged(
        [("base", run(Config(2), 400.0)), ("start", run(Config(2, context="forkserver"), 396.0))],
        {"start_method": "fork"},
    )
    assert f.severity.value == "info" and "as fast" in f.title


def test_a_forkserver_pipeline_is_told_what_fork_saves():
    (f,) = judged(
        [("base", run(Config(2), 100.0)), ("start", run(Config(2, context="fork"), 300.0))],
        {"start_method": "forkserver"},
    )
    assert f.fix == {"multiprocessing_context": "fork"} and f.gain.value == pytest.approx(3.0)
    none = judged(
        [("base", run(Config(2), 100.0)), ("start", run(Config(2, context="fork"), 103.0))],
        {"start_method": "spawn"},
    )
    assert none == []


def test_a_forking_pipeline_whose_dataset_does_not_pickle_cannot_start_under_forkserver():
    (f,) = judged(
        [("base", run(Config(2), 400.0))],
        {
            "start_method": "fork",
            "dataset_pickle_error": "TypeError: cannot pickle '_io.TextIOWrapper'",
        },
    )
    assert f.severity.value == "warning" and "cannot start under forkserver" in f.title
    assert "TextIOWrapper" in f.evidence
