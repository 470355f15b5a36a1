"""A trainer's callback reads its DataLoader workers' CPU (loop/steps.py): the stage
split's tap sees each iterator the trainer makes from the DataLoader, and the hooks
read that iterator's workers every few steps, as the `for` loop reads its pass's. And
each later pass's restart (loop/splits.restart_wait_ms), which more workers do not
shorten, is kept in both steps of the worker model's forecast (advice/stepworkers)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.advice.loopmodel import Forecast, WorkerAdvice
from starvecheck.advice.stepworkers import restarts_kept
from starvecheck.core.schema.steps import Step
from starvecheck.loop.splits import restart_wait_ms

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402


def spin(seconds: float) -> None:
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass


class Spinning(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        spin(0.004)
        return torch.zeros(4)


def held(dataset: Dataset) -> tuple[DataLoader, Any]:
    """A DataLoader of 2 forked workers, held by a trainer's hooks as the callbacks
    hold theirs (no fetcher ahead): (the loader, the Hooked)."""
    from starvecheck.loop.trainers.hooks import Hooked

    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork")
    hooked = Hooked(show=False)
    hooked._workers(2)
    return loader, hooked


def test_a_trainers_hooks_read_the_workers_of_each_iterator_it_makes():
    loader, hooked = held(Spinning())
    before = iter(loader)  # the trainer's first epoch: its iterator made before any hook
    hooked._loader(loader, ahead=0)
    w = hooked.watch
    w.begin_pass()
    for _batch in before:
        w.begin_step()
        w.end_step()
    assert w.times.worker_cpu == []  # its workers' pids were never seen: not read
    assert w._machine_cpu() is None  # nor the machine (their CPU would read as others')
    for _ in range(2):
        w.begin_pass()
        for _batch in loader:  # made after the hold: the tap sees it made
            w.begin_step()
            time.sleep(0.002)
            w.end_step()
        assert w._machine_cpu() is not None  # read beside these workers
    hooked._ended()
    figures = w.times.figures()[0]
    # 4 samples of 4 ms of CPU a batch, read from the workers themselves
    assert 8.0 < figures.value_of(Step.WORKER_CPU_MS) < 200.0
    restart = figures.value_of(Step.RESTART_WAIT_MS)
    assert restart is not None and restart >= 0.0  # two later passes began
    assert w.times.split.pass_starts == [0, 12, 24]
    assert w._worker_cpu is None and w._workers_of is None  # let go with the training
    assert "_get_iterator" not in vars(loader)


def test_a_later_passes_first_wait_past_its_pass_usual_wait_is_its_restart():
    waits = [0.5, 0.01, 0.01, 0.01, 0.1, 0.01, 0.01, 0.02]
    # the run's first step left out; the pass at 4 waited 0.1 s against a usual 0.01
    assert restart_wait_ms(waits, 1, [0, 4]) == pytest.approx(0.09 / 7 * 1e3)
    assert restart_wait_ms(waits, 1, [0]) is None  # no later pass
    assert restart_wait_ms(waits, 1, [0, 8]) is None  # a pass that never took a step
    # a first wait shorter than the pass's usual: no restart, never a negative one
    assert restart_wait_ms([0.5, 0.02, 0.02, 0.001, 0.03, 0.03], 1, [0, 3]) == 0.0
    # a rank's window (first 0): its start at 0 is the window's own, not a restart
    assert restart_wait_ms([0.3, 0.01, 0.01], 0, [0]) is None
    assert restart_wait_ms([0.01, 0.3], 0, [0, 1]) == pytest.approx(0.3 / 2 * 1e3)


@given(
    st.lists(st.floats(0, 10, allow_nan=False), max_size=40),
    st.integers(0, 3),
    st.lists(st.integers(-5, 50), max_size=8),
)
def test_a_restart_is_none_or_within_the_waits(waits, first, starts):
    got = restart_wait_ms(waits, first, starts)
    if got is not None:
        assert 0.0 <= got <= sum(waits[first:]) / (len(waits) - first) * 1e3 + 1e-9


def hookless_pass(loader: DataLoader, hooked: Any) -> Any:
    """One pass held by the hooks, as transformers' hooks see it (no batch in them);
    the stage split's tap, before the end lets it go."""
    hooked._loader(loader, ahead=0)
    w = hooked.watch
    w.begin_pass()
    for _batch in loader:
        w.begin_step()  # no batch, as transformers' on_step_begin
        w.end_step()
    tap = w._held()
    hooked._ended()
    return tap


def test_the_restarts_stay_in_both_steps_of_the_forecast():
    f = Forecast(step_ms=20.0, speedup=1.5, available_cpus=1.9, cpu_bound=False, cpu_work=False)
    a = restarts_kept(WorkerAdvice(4, "why", 2, f), 2.0)
    assert a is not None and a.forecast is not None
    # 30 ms now, steady, and 2 ms a step of restarts in both: 32 ms to 22 ms
    assert a.forecast.step_ms == pytest.approx(22.0)
    assert a.forecast.speedup == pytest.approx(32.0 / 22.0)
    assert a.forecast.restart_ms == 2.0
    assert restarts_kept(WorkerAdvice(4, "why", 2, f), 0.0).forecast is f  # none: as it was
    assert restarts_kept(None, 2.0) is None


def test_hooks_that_see_no_batch_take_its_bytes_from_the_workers_own_count():
    """transformers' hooks get no batch: each worker writes the bytes of its first
    batches (loading/stamps.SIZED) with their record, and the hooks take the largest."""
    from starvecheck.loading.stamps import SIZED

    class Rows(Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int):
            return {"x": torch.zeros(256, dtype=torch.float32), "y": torch.tensor(i)}

    loader, hooked = held(Rows())
    tap = hookless_pass(loader, hooked)
    assert hooked.watch.times.batch_bytes == 4 * 256 * 4 + 4 * 8  # x float32, y int64
    # a worker writes its first batches' bytes only; the rest cost it nothing
    assert tap is not None and (tap.rows[:, 1 + SIZED :, 7] == 0).all()


def test_each_worker_added_starts_at_every_later_pass_too():
    from starvecheck.advice.loadstages import Waits, start_each_ms

    f = Forecast(step_ms=20.0, speedup=1.5, available_cpus=1.9, cpu_bound=False, cpu_work=False)
    # 2 workers to 4, each 0.5 ms a step more at the restarts: 32 ms now, 20 + 2 + 1 after
    a = restarts_kept(WorkerAdvice(4, "why", 2, f), 2.0, start_each_ms=0.5)
    assert a is not None and a.forecast is not None
    assert a.forecast.step_ms == pytest.approx(23.0)
    assert a.forecast.speedup == pytest.approx(32.0 / 23.0)
    # the slowest of 2 workers ready 40 ms after the pass began, a pass of 60 steps
    w = Waits({}, {}, {}, 100, startup_s=0.04, later_pass_steps=60.0)
    assert start_each_ms(w, 2) == pytest.approx(40.0 / 2 / 60)
    assert start_each_ms(w, 0) == 0.0 and start_each_ms(None, 2) == 0.0
    assert start_each_ms(Waits({}, {}, {}, 100, startup_s=0.04), 2) == 0.0  # persistent
    # num_workers=0: one worker's start as the hand-over's measurement timed it here,
    # 26 ms, once in a later pass's 40 steps; unread or with no later pass, none
    w = Waits({}, {}, {}, 100, later_pass_steps=40.0)
    assert start_each_ms(w, 0, 26.0) == pytest.approx(26.0 / 40)
    assert start_each_ms(w, 0) == 0.0 and start_each_ms(w, 0, None) == 0.0
    assert start_each_ms(Waits({}, {}, {}, 100), 0, 26.0) == 0.0


def test_workers_advised_from_num_workers_0_pay_each_ones_start_every_later_pass():
    """measured_advice at num_workers=0 keeps, in the step advised, each later pass's
    first batch and every added worker's start (the hand-over measurement's)."""
    from starvecheck.advice.stepworkers import Restarts, measured_advice
    from starvecheck.core.schema.figure import Figure
    from starvecheck.core.schema.steps import Parameters, StepFigure, StepFigures

    def figures(**values: float) -> Any:
        return StepFigures(
            tuple(StepFigure(Step(q), Figure.single(v), "ms") for q, v in values.items())
        )

    # 46 ms steps: 25 ms of CPU making each batch, a sleep of 21 ms; two CPUs, quiet
    m = figures(data_wait_cpu_ms=25.0, compute_cpu_ms=0.5, data_wait_process_cpu_ms=25.0)
    params = Parameters(
        {"effective_cpus": 2.0, "dataloader": "_SingleProcessDataLoaderIter", "num_workers": 0}
    )
    plain = measured_advice(m, params, 25.0, 46.0)
    kept = measured_advice(m, params, 25.0, 46.0, Restarts(0.5, 40.0))
    assert plain is not None and kept is not None and plain.forecast and kept.forecast
    assert kept.workers == plain.workers >= 1
    # a first batch a pass (25 / 40) and each worker's start (0.5 a step)
    extra = 25.0 / 40 + kept.workers * 0.5
    assert kept.forecast.step_ms == pytest.approx(plain.forecast.step_ms + extra)
    assert kept.forecast.restart_ms == pytest.approx(extra)


def test_transformers_callback_takes_the_dataloaders_own_worker_count():
    """A get_train_dataloader() of the user's own need not follow the arguments'
    dataloader_num_workers: the DataLoader the Trainer hands the hooks says."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from starvecheck.integrations import TransformersCallback

    loader = DataLoader(Spinning(), batch_size=4, num_workers=2)
    args = SimpleNamespace(dataloader_num_workers=0, gradient_accumulation_steps=1)
    cb = TransformersCallback(show=False)
    cb.on_train_begin(args, None, None, train_dataloader=loader)
    assert cb.watch.times.num_workers == 2
    cb.on_train_end(args, None, None)
    # no DataLoader given: the arguments' count, as before
    other = TransformersCallback(show=False)
    other.on_train_begin(args, None, None)
    assert other.watch.times.num_workers == 0


def test_workers_advised_where_none_load_now_pay_a_first_batch_every_later_pass():
    f = Forecast(step_ms=20.0, speedup=1.5, available_cpus=1.9, cpu_bound=False, cpu_work=True)
    # num_workers=0 now (30 ms a step, no restart in it); 2 workers would wait for one's
    # whole first batch every later pass: 1 ms a step more, 30 ms to 21 ms
    a = restarts_kept(WorkerAdvice(2, "why", 0, f), 0.0, 1.0)
    assert a is not None and a.forecast is not None
    assert a.forecast.step_ms == pytest.approx(21.0)
    assert a.forecast.speedup == pytest.approx(30.0 / 21.0)
    # no worker advised: nothing restarts
    assert restarts_kept(WorkerAdvice(0, "why", 0, f), 0.0, 1.0).forecast is f
    # with workers now, the first batch is in the measured restart already
    assert restarts_kept(WorkerAdvice(4, "why", 2, f), 0.0, 1.0).forecast is f


def test_hooks_that_see_no_batch_at_num_workers_0_take_its_bytes_from_the_collate():
    """At num_workers=0 no worker writes a record: the collate, run in the training
    process, counts its first batches' bytes (transformers' hooks see no batch), so the
    hand-over a worker would add is measured for them."""
    from starvecheck.loop.trainers.hooks import Hooked

    class Rows(Dataset):
        def __len__(self) -> int:
            return 24

        def __getitem__(self, i: int):
            return torch.zeros(512, dtype=torch.float32)

    loader = DataLoader(Rows(), batch_size=4)
    hooked = Hooked(show=False)
    hooked._workers(0)
    hookless_pass(loader, hooked)
    assert hooked.watch.times.batch_bytes == 4 * 512 * 4
