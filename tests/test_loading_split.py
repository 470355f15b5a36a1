"""The stage split's arithmetic (loading/split.py): a wait partitioned over the stages
of the batch's timeline, known cases and any times at all."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.core.schema.loading import LoadStage
from starvecheck.loading.split import (
    INDEX,
    STAGES,
    Batch,
    busy,
    cpu_share,
    exposed,
    held,
    in_process,
)


def _named(values: list[float]) -> dict[LoadStage, float]:
    return {s: v for s, v in zip(STAGES, values, strict=True) if abs(v) > 1e-12}


def test_a_wait_for_a_read_bound_fetch_is_read():
    # The worker was free at 0, fetched 0-90 ms with 1 ms of CPU, collated to 92, and
    # the loop asked at 50 and had it at 93.
    b = Batch(free=0.0, collate=0.090, done=0.092, fetch_cpu=0.001)
    out = exposed(0.050, 0.093, b)
    assert sum(out) == pytest.approx(0.043)
    got = _named(out)
    assert got[LoadStage.READ] == pytest.approx(0.040 * 89 / 90)
    assert got[LoadStage.TRANSFORM] == pytest.approx(0.040 / 90)
    assert got[LoadStage.COLLATE] == pytest.approx(0.002)
    assert got[LoadStage.HANDOVER] == pytest.approx(0.001)


def test_a_cpu_bound_fetch_is_transform_and_its_run_queue_counts_as_cpu():
    b = Batch(free=0.0, collate=0.100, done=0.101, fetch_cpu=0.100)
    got = _named(exposed(0.0, 0.102, b))
    assert got[LoadStage.TRANSFORM] == pytest.approx(0.100)
    assert LoadStage.READ not in got


def test_a_batch_ready_before_it_was_asked_for_is_all_handover():
    b = Batch(free=0.0, collate=0.010, done=0.011, fetch_cpu=0.0)
    assert _named(exposed(0.050, 0.052, b)) == {LoadStage.HANDOVER: pytest.approx(0.002)}


def test_a_new_workers_first_batch_waits_for_its_start_up_and_its_index():
    # Ready at 1.0 s, its index sent when iter() had started every worker (2.0 s).
    b = Batch(free=2.0, collate=2.010, done=2.012, fetch_cpu=0.010, ready=1.0)
    got = _named(exposed(0.0, 2.013, b))
    assert got[LoadStage.STARTUP] == pytest.approx(2.0)
    assert got[LoadStage.TRANSFORM] == pytest.approx(0.010)
    assert got[LoadStage.COLLATE] == pytest.approx(0.002)


def test_the_hand_over_held_by_the_workers_next_batch_goes_to_that_batchs_work():
    # Batch done at 10 ms; the worker's next batch fetched 10-40 ms on the CPU (a Python
    # transform holds the interpreter's lock the sending thread needs); the loop had
    # the first batch only at 40 ms.
    b = Batch(free=0.0, collate=0.009, done=0.010, fetch_cpu=0.009)
    nxt = Batch(free=0.010, collate=0.040, done=0.041, fetch_cpu=0.030)
    out = exposed(0.005, 0.040, b)
    assert _named(out)[LoadStage.HANDOVER] == pytest.approx(0.030)
    moved = _named(held(out, 0.005, 0.040, b, [nxt]))
    assert moved[LoadStage.TRANSFORM] == pytest.approx(0.004 + 0.030)
    assert LoadStage.HANDOVER not in moved


def test_another_workers_computing_holds_the_hand_over_too():
    # Batch done at 10 ms by an idle worker; another worker collated in Python from 5 to
    # 30 ms: the batches cross one queue, and its busy interpreter held this one back.
    b = Batch(free=0.0, collate=0.009, done=0.010, fetch_cpu=0.0)
    other = Batch(free=0.0, collate=0.005, done=0.030, fetch_cpu=0.0, collate_cpu=0.025)
    out = exposed(0.010, 0.031, b)
    moved = _named(held(out, 0.010, 0.031, b, [other]))
    assert moved[LoadStage.COLLATE] == pytest.approx(0.020)
    assert moved[LoadStage.HANDOVER] == pytest.approx(0.001)


def test_a_next_batch_that_reads_leaves_the_hand_over_as_it_was():
    b = Batch(free=0.0, collate=0.009, done=0.010, fetch_cpu=0.009)
    nxt = Batch(free=0.010, collate=0.040, done=0.041, fetch_cpu=0.0)  # sleeping: no lock
    out = exposed(0.005, 0.040, b)
    assert held(out, 0.005, 0.040, b, [nxt]) == out


def test_a_next_batch_waiting_for_a_cpu_holds_only_what_it_computed():
    # The worker's next batch took 10-40 ms, of which 24 ms waiting for a CPU (other
    # workers and their senders had them; Lightning's 64 MB batches, copied in torch):
    # only its 6 ms on a CPU held the hand-over; the rest stays the hand-over's.
    b = Batch(free=0.0, collate=0.009, done=0.010, fetch_cpu=0.009)
    nxt = Batch(free=0.010, collate=0.040, done=0.041, fetch_cpu=0.030, fetch_runq=0.024)
    out = exposed(0.005, 0.040, b)
    moved = _named(held(out, 0.005, 0.040, b, [nxt]))
    assert moved[LoadStage.TRANSFORM] == pytest.approx(0.004 + 0.006)
    assert moved[LoadStage.HANDOVER] == pytest.approx(0.024)


def test_busy_counts_the_work_wherever_it_ran():
    b = Batch(free=0.0, collate=0.080, done=0.100, fetch_cpu=0.020, collate_cpu=0.020)
    got = _named(busy(b, 0.003))
    assert got[LoadStage.TRANSFORM] == pytest.approx(0.020)
    assert got[LoadStage.READ] == pytest.approx(0.060)
    assert got[LoadStage.COLLATE] == pytest.approx(0.020)
    assert got[LoadStage.HANDOVER] == pytest.approx(0.003)


def test_in_the_training_process_the_rest_of_the_wait_is_pinning_only_where_pinned():
    plain = _named(in_process(0.0, 0.050, 0.030, 0.040, 0.030, pinned=False))
    assert plain == {
        LoadStage.TRANSFORM: pytest.approx(0.030),
        LoadStage.COLLATE: pytest.approx(0.020),
    }
    pinned = _named(in_process(0.0, 0.050, 0.030, 0.040, 0.0, pinned=True))
    assert pinned[LoadStage.READ] == pytest.approx(0.030)
    assert pinned[LoadStage.PIN] == pytest.approx(0.010)


def test_cpu_share_is_a_share():
    assert cpu_share(2.0, 1.0) == 1.0
    assert cpu_share(0.5, 1.0) == 0.5
    assert cpu_share(-1.0, 1.0) == 0.0
    assert cpu_share(0.1, 0.0) == 1.0
    assert cpu_share(math.nan, 1.0) == 1.0


times = st.one_of(st.floats(min_value=-10.0, max_value=10.0), st.just(math.nan))
finite = st.floats(min_value=-10.0, max_value=10.0)
cpus = st.floats(min_value=-1.0, max_value=10.0, allow_nan=False)


@given(finite, finite, times, times, times, cpus, st.one_of(st.none(), times), times, times, cpus)
def test_the_stages_of_any_wait_add_up_to_it_and_none_is_negative(
    asked, received, free, collate, done, cpu, ready, n_collate, n_done, n_cpu
):
    b = Batch(free=free, collate=collate, done=done, fetch_cpu=cpu, collate_cpu=cpu, ready=ready)
    nxt = Batch(free=done, collate=n_collate, done=n_done, fetch_cpu=n_cpu, collate_cpu=n_cpu)
    out = exposed(asked, received, b)
    moved = held(out, asked, received, b, [nxt, b])
    wait = max(0.0, received - asked)
    for split in (out, moved):
        assert len(split) == len(STAGES)
        assert all(v >= -1e-12 for v in split)
        assert sum(split) == pytest.approx(wait, abs=1e-9)
    assert moved[INDEX[LoadStage.STARTUP]] == out[INDEX[LoadStage.STARTUP]]
