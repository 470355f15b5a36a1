"""watch splits each step's wait for data over the stages of loading (loading/,
loop/splits.py): the stage that holds the loop back is named, the stages add up to the
wait, the user's DataLoader is left as it was, and nothing of the split ever breaks
the loop. Each pipeline here is built so that one stage dominates by a wide margin
(sleeps and CPU spins of tens of milliseconds against microseconds of the rest), so
the checks hold on a loaded machine; the accuracy of the split and of its fixes is
benchmarks/stage_split.py's."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, default_collate  # noqa: E402

import starvecheck  # noqa: E402
from starvecheck.core.catalogue import PROFILE_DATA_BOUND  # noqa: E402
from starvecheck.core.metric import select, value  # noqa: E402
from starvecheck.core.schema.loading import (  # noqa: E402
    EXPOSED_MS,
    EXPOSED_SHARE,
    SPLIT_STEPS,
    LoadStage,
)


def spin(seconds: float) -> None:
    """CPU work: this thread's CPU time, whatever else the machine does."""
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass


class Sleepy(Dataset):
    def __init__(self, n: int = 64, s: float = 0.01) -> None:
        self.n, self.s = n, s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.s)
        return torch.zeros(4)


class Spinning(Sleepy):
    def __getitem__(self, i: int):
        spin(self.s)
        return torch.zeros(4)


class Cheap(Sleepy):
    def __getitem__(self, i: int):
        return torch.zeros(4)


def slow_collate(batch):
    time.sleep(0.02)
    return default_collate(batch)


def spin_collate(batch):
    spin(0.03)
    return default_collate(batch)


def shares(result) -> dict[LoadStage, float]:
    return {
        LoadStage(m.labels["load_stage"]): m.value
        for m in select(result.figures, quantity=EXPOSED_SHARE)
    }


def watched(loader, compute_s: float = 0.002, **options):
    w = starvecheck.watch(loader, show=False, **options)
    for _ in w:
        spin(compute_s)
    return w


def top(result) -> LoadStage:
    s = shares(result)
    return max(s, key=lambda k: s[k])


@pytest.mark.parametrize(
    ("dataset", "collate", "stage"),
    [
        (Sleepy(24), None, LoadStage.READ),
        (Spinning(24, 0.005), None, LoadStage.TRANSFORM),
        (Cheap(24), slow_collate, LoadStage.COLLATE),
    ],
    ids=["read", "transform", "collate"],
)
def test_in_the_training_process_the_stage_that_dominates_is_named(dataset, collate, stage):
    kwargs = {"collate_fn": collate} if collate else {}
    w = watched(DataLoader(dataset, batch_size=2, **kwargs))
    r = w.result()
    s = shares(r)
    assert top(r) is stage
    assert s[stage] > 0.6
    assert sum(s.values()) == pytest.approx(1.0, abs=1e-6)
    # The stages of a step add up to its wait: their means to the wait's mean.
    exposed = sum(m.value for m in select(r.figures, quantity=EXPOSED_MS))
    waits = list(w.times.waits[1:])
    assert exposed == pytest.approx(sum(waits) / len(waits) * 1e3, rel=1e-6)
    assert value(r.figures, quantity=SPLIT_STEPS) == len(waits)


def test_the_finding_says_what_the_wait_is_made_of():
    r = watched(DataLoader(Sleepy(24), batch_size=2)).result()
    found = next(f for f in r.findings if f.id == PROFILE_DATA_BOUND)
    assert "By stage" in found.evidence
    assert "read " in found.evidence


def test_the_users_dataloader_is_left_as_it_was():
    def init(worker_id: int) -> None:
        pass

    loader = DataLoader(Cheap(8), batch_size=2, collate_fn=slow_collate, worker_init_fn=init)
    w = starvecheck.watch(loader, show=False)
    for _ in w:
        assert loader.collate_fn is slow_collate  # put back once iter() made the workers
        assert loader.worker_init_fn is init
    assert value(w.result().figures, quantity=SPLIT_STEPS) == 3


def test_what_is_not_a_dataloader_is_timed_without_a_split():
    w = watched([torch.zeros(2)] * 6)
    assert not select(w.result().figures, quantity=EXPOSED_SHARE)


class Stubborn(DataLoader):
    """A DataLoader that will not take another collate_fn once made."""

    def __setattr__(self, name, value):
        if name == "collate_fn" and hasattr(self, "collate_fn"):
            raise AttributeError("collate_fn is fixed here")
        super().__setattr__(name, value)


def test_a_dataloader_that_refuses_the_wrapper_is_timed_without_a_split():
    w = watched(Stubborn(Sleepy(8), batch_size=2))
    assert len(w.times.waits) == 4
    assert not select(w.result().figures, quantity=EXPOSED_SHARE)


def test_the_split_crosses_to_rank_0_with_the_waits():
    from starvecheck.loop.times import RankTimes

    w = watched(DataLoader(Sleepy(12), batch_size=2))
    t = w.times
    got = RankTimes.decode(t.encode(rank=1, final=True, window=64)).times
    assert list(got.split.exposed[LoadStage.READ]) == list(t.split.exposed[LoadStage.READ])
    assert got.split.busy == t.split.busy
    cut = RankTimes.decode(t.encode(rank=1, final=True, window=3)).times
    assert len(cut.split.exposed[LoadStage.READ]) == 3


@pytest.mark.slow
def test_workers_that_wait_on_reads_are_read():
    r = watched(DataLoader(Sleepy(48, 0.02), batch_size=4, num_workers=2)).result()
    assert top(r) is LoadStage.READ
    assert shares(r)[LoadStage.READ] > 0.5


@pytest.mark.slow
def test_a_worker_whose_next_collate_holds_the_lock_is_collate_not_handover():
    loader = DataLoader(Cheap(32), batch_size=4, num_workers=1, collate_fn=spin_collate)
    r = watched(loader, compute_s=0.005).result()
    assert top(r) is LoadStage.COLLATE


class Heavy(Dataset):
    """A dataset that carries 64 MB: under forkserver each worker unpickles it."""

    def __init__(self) -> None:
        self.blob = bytes(64 << 20)

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return torch.zeros(4)


@pytest.mark.slow
def test_workers_started_every_pass_under_forkserver_are_start_up_and_the_fix_keeps_them():
    loader = DataLoader(Heavy(), batch_size=4, num_workers=2, multiprocessing_context="forkserver")
    w = starvecheck.watch(loader, show=False)
    for _ in range(3):
        for _ in w:
            spin(0.002)
    r = w.result()
    assert top(r) is LoadStage.STARTUP
    assert r.parameters.get("start_method") == "forkserver"
    found = next(f for f in r.findings if f.id == PROFILE_DATA_BOUND)
    assert found.fix == {"persistent_workers": True}
    assert "persistent_workers=True" in found.recommendation
    assert found.gain is not None and found.gain.value is not None and found.gain.value > 1


@pytest.mark.slow
def test_spawned_workers_are_split_too():
    loader = DataLoader(
        Sleepy(16, 0.01), batch_size=2, num_workers=2, multiprocessing_context="spawn"
    )
    w = watched(loader)
    r = w.result()
    assert value(r.figures, quantity=SPLIT_STEPS) == len(w.times.waits) - 1
    assert r.parameters.get("start_method") == "spawn"


def test_stages_false_leaves_the_dataloader_alone():
    loader = DataLoader(Sleepy(8), batch_size=2)
    own = loader.collate_fn
    w = starvecheck.watch(loader, show=False, stages=False)
    for _ in w:
        assert loader.collate_fn is own
    assert not select(w.result().figures, quantity=EXPOSED_SHARE)
    with pytest.raises(TypeError, match="stages must be True or False"):
        starvecheck.watch(loader, stages="yes")


@pytest.mark.slow
def test_a_trainers_workers_started_every_pass_are_start_up_not_read():
    """A trainer makes each pass's iterator itself, after the pass began: a new worker's
    first fetch waits for its first index, sent once iter() has started every worker
    (seconds under forkserver). Counted from the worker's readiness, that wait read as
    the fetch's, and Lightning's callback named read where start-up held the loop back."""
    from starvecheck.loop.trainers.hooks import Hooked

    loader = DataLoader(Heavy(), batch_size=4, num_workers=2, multiprocessing_context="forkserver")
    hooked = Hooked(show=False)
    hooked._workers(2)
    hooked._loader(loader, ahead=0)
    for _ in range(3):
        hooked.watch.begin_pass()
        for _batch in loader:  # the trainer's own iterator, made after the pass began
            hooked.watch.begin_step()
            spin(0.002)
            hooked.watch.end_step()
    hooked._ended()
    r = hooked.watch.result()
    s = shares(r)
    assert top(r) is LoadStage.STARTUP, s
    assert s[LoadStage.STARTUP] > 3 * s[LoadStage.READ], s
    assert "_get_iterator" not in vars(loader)  # the DataLoader as it was
