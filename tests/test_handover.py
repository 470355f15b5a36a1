"""What handing a batch from a DataLoader worker costs (loop/handover.py): the bytes of a
batch found through any structure, the measurement with a real worker (nothing left
running), and watch measuring it for a loop with big batches."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.loading.stamps import batch_nbytes
from starvecheck.loop.handover import measure, worth_measuring
from tests.conftest import children

MIB = 1 << 20

np = pytest.importorskip("numpy")

LOADED_LIMIT_S = 120.0  # a 2-CPU machine shared with other work: 15 batches of 64 MiB


def test_batch_bytes_are_found_through_tuples_lists_and_mappings():
    torch = pytest.importorskip("torch")
    x = torch.zeros(32, 3, 8, 8)  # 24,576 bytes
    batch = {"image": x, "label": torch.zeros(32, dtype=torch.int64), "ids": [np.zeros(4)]}
    assert batch_nbytes(batch) == 24_576 + 256 + 32
    assert batch_nbytes((x, b"abc", "text", 7, None)) == 24_576 + 3
    assert batch_nbytes(x) == 24_576


def test_batch_bytes_are_bounded_in_depth_and_count():
    deep: list = [np.zeros(8)]  # 64 bytes, ten lists down
    for _ in range(10):
        deep = [deep]
    assert batch_nbytes(deep) == 0
    many = [np.zeros(1) for _ in range(5000)]  # 8 bytes each, 1,000 objects looked at
    assert 0 < batch_nbytes(many) < 8 * 1000
    assert batch_nbytes(np) == 0 and batch_nbytes(type) == 0  # a module, a class


@given(
    st.recursive(
        st.none() | st.integers() | st.text() | st.binary(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c) | st.tuples(c, c),
        max_leaves=30,
    )
)
def test_property_batch_bytes_of_anything_is_a_count(item):
    n = batch_nbytes(item)
    assert isinstance(n, int) and n >= 0


def test_only_a_loop_that_waits_is_worth_measuring_whatever_its_batches_size():
    pytest.importorskip("torch")
    waits, computes = [1.0, 0.02, 0.02], [0.01, 0.02, 0.02]
    assert worth_measuring(MIB, waits, computes)
    # A batch's trip through the queues costs about a millisecond however small it is.
    assert worth_measuring(256, waits, computes)
    assert not worth_measuring(MIB, [1.0, 0.0, 0.001], [0.01, 0.1, 0.1])  # fed
    assert not worth_measuring(MIB, [], [])


@pytest.mark.slow
def test_the_handover_is_measured_with_a_real_worker_and_nothing_is_left():
    pytest.importorskip("torch")
    before = children(os.getpid())
    # LIMIT_S (10 s) is watch's own bound, which a loaded machine may pass (None, said
    # as not measured): here the measurement itself is the point, so a generous one.
    h = measure(4 * MIB, limit_s=LOADED_LIMIT_S)
    assert h is not None and h.nbytes == 4 * MIB and h.batches == 10
    assert h.worker_ms >= 0 and h.main_ms >= 0
    big = measure(64 * MIB, limit_s=LOADED_LIMIT_S)
    assert big is not None and big.nbytes == 64 * MIB and big.main_ms >= 0
    deadline = time.monotonic() + 10
    while children(os.getpid()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children(os.getpid()) - before == set()
    small = measure(256, limit_s=LOADED_LIMIT_S)
    assert small is not None and small.nbytes == 256 and small.main_ms >= 0


@pytest.mark.accuracy
def test_bigger_batches_cost_the_training_process_more():
    """Mapping and reading a 64 MiB batch costs the training process more than a 4 MiB
    one: two measured times compared, each a difference of medians (clipped at 0), which
    a loaded machine can blur (moved from the slow test above)."""
    pytest.importorskip("torch")
    h = measure(4 * MIB)
    big = measure(64 * MIB)
    assert h is not None and big is not None
    assert big.main_ms > h.main_ms, (big.main_ms, h.main_ms)


def test_watch_measures_the_handover_for_a_loop_with_big_batches(monkeypatch, machine_alone):
    torch = pytest.importorskip("torch")
    import starvecheck.loop.reporting as reporting

    calls = []
    real = reporting.measure_handover
    monkeypatch.setattr(reporting, "measure_handover", lambda n: calls.append(n) or real(n))
    from torch.utils.data import DataLoader, Dataset

    import starvecheck

    class Images(Dataset):  # 2 ms of CPU a sample, float samples of 0.6 MB
        def __len__(self) -> int:
            return 4 * 30

        def __getitem__(self, i: int):
            end = time.thread_time() + 0.002
            while time.thread_time() < end:
                pass
            return torch.ones(3, 224, 224)

    w = starvecheck.watch(DataLoader(Images(), batch_size=4), show=False)
    for _ in w:
        time.sleep(0.004)
    r = w.result()
    assert r.value(quantity="batch_bytes") == 4 * 3 * 224 * 224 * 4
    assert r.value(quantity="handover_worker_cpu_ms") is not None
    assert r.value(quantity="handover_main_ms") is not None
    # the measurement's worker started (forked here) before its first batch came back
    assert (r.value(quantity="worker_start_ms") or 0.0) > 0.0
    assert r.value(quantity="compute_process_cpu_ms") is not None
    (f,) = [f for f in r.findings if f.id == "profile.data-bound"]
    if f.fix.get("num_workers"):  # a count advised: its arithmetic counts the hand-over
        assert "handing each batch of 2.4 MB over from a worker costs" in f.recommendation
    elif "too wide" in f.gain.basis:  # torch's pool took CPU beside the loading thread:
        # a worker's cost lies between the two, and the forecasts at both ends part
        assert "torch's intra-op pool" in f.recommendation, f.recommendation
    else:  # the hand-over measured as costly as the decode saved (a loaded machine): the
        # model, counting it, finds no count that clears the noise, and says so
        assert "No worker count clears the noise" in f.recommendation, f.recommendation
    # Measured once per batch size: a second report does not measure again.
    w.result()
    assert calls == [4 * 3 * 224 * 224 * 4]


def test_a_workers_one_off_work_is_left_out_of_its_cpu_a_batch(monkeypatch):
    """The worker's CPU a batch is the median of its schedstat between two batches: a
    forked child of Lightning's process once took 250 ms of CPU beyond its batches, read
    as 25 ms a batch over 10, and the model then saw no gain in any worker count."""
    pytest.importorskip("torch")
    import starvecheck.loop.handover as handover

    readings = iter([0.001 * i + (0.25 if i >= 6 else 0.0) for i in range(64)])
    monkeypatch.setattr(handover, "_on_cpu", lambda pid: next(readings))
    got = measure(2048)
    assert got is not None
    assert 0.5 < got.worker_ms < 1.05  # 1 ms a batch, less the making of a batch
    monkeypatch.setattr(handover, "_on_cpu", lambda pid: None)  # no schedstat: the ticks
    assert measure(2048) is not None
