"""The stage split's own fixes (advice/loadstages.py): persistent_workers for a
start-up each pass, num_workers=0 for a hand-over of large batches where a batch made
alone fits the step, and nothing for a hand-over too small to be the bytes' work."""

from __future__ import annotations

import pytest

from starvecheck.advice.loadstages import (
    HANDOVER_BYTES,
    LoopThread,
    Waits,
    handover_fix,
    startup_fix,
)
from starvecheck.core.model import GainKind
from starvecheck.core.schema.loading import LoadStage


def waits(top: LoadStage, share: float = 0.8, **kw: float | None) -> Waits:
    rest = LoadStage.READ if top is not LoadStage.READ else LoadStage.TRANSFORM
    return Waits(
        exposed_ms={top: 40.0 * share, rest: 40.0 * (1 - share)},
        share={top: share, rest: 1 - share},
        busy_ms={},
        steps=100,
        **kw,  # type: ignore[arg-type]
    )


def test_a_large_hand_over_whose_batch_made_alone_fits_the_step_is_num_workers_0():
    w = waits(LoadStage.HANDOVER, solo_ms=8.0)
    said, gain, fix = handover_fix(w, 64e6, 45.0, 5.0, 2) or ("", None, {})
    assert fix == {"num_workers": 0} and "64.0 MB" in said
    assert gain is not None and gain.kind is GainKind.THROUGHPUT
    assert gain.value == pytest.approx(45.0 / 13.0, abs=0.01)


def test_a_large_hand_over_that_in_process_loading_would_not_beat_gets_no_figure():
    w = waits(LoadStage.HANDOVER, solo_ms=40.0)  # 40 + 5 ms is no shorter than 45
    said, gain, fix = handover_fix(w, 64e6, 45.0, 5.0, 2) or ("", None, {})
    assert fix == {} and "fewer bytes" in said
    assert gain is not None and gain.kind is GainKind.STEP_SHARE and gain.value == 0.8


def test_a_small_batchs_hand_over_is_the_workers_advice_not_num_workers_0():
    # 64 bytes cannot take 40% of a step to pass: the training process waited for a CPU.
    w = waits(LoadStage.HANDOVER, solo_ms=8.0)
    assert handover_fix(w, 64.0, 45.0, 5.0, 2) is None
    assert handover_fix(w, HANDOVER_BYTES - 1, 45.0, 5.0, 2) is None
    assert handover_fix(w, None, 45.0, 5.0, 2) is None  # bytes unknown: no figure either
    assert handover_fix(waits(LoadStage.READ), 64e6, 45.0, 5.0, 2) is None


def test_start_up_each_pass_is_persistent_workers_with_what_the_later_passes_saw():
    w = waits(LoadStage.STARTUP, startup_s=3.5, unpickle_s=3.2, restart_ms=30.0)
    said, gain, fix = startup_fix(w, 40.0, 2, "forkserver") or ("", None, {})
    assert fix == {"persistent_workers": True} and "3.20 s" in said and "fork start" in said
    # The mean step 40 ms, 32 of it start-up over every pass: 8 ms a step without it;
    # each later pass waited 30 ms a step of its own for its workers: 38 ms to 8 ms.
    assert gain is not None and gain.value == pytest.approx(38.0 / 8.0, abs=0.01)
    assert "from 38.0 ms to 8.0 ms" in gain.basis
    # Nothing measured past the first pass: the share, an upper bound, no speed-up.
    _, gain, _ = startup_fix(waits(LoadStage.STARTUP), 40.0, 2, "fork") or ("", None, {})
    assert gain is not None and gain.kind is GainKind.STEP_SHARE
    assert startup_fix(waits(LoadStage.COLLATE), 40.0, 2, "fork") is None


def test_a_batch_timed_at_num_workers_0_sets_the_figure_and_the_workers_costs_leave_the_step():
    # Step 45 ms: 23 ms of compute, 9 of it waiting for a CPU the workers held and 8 of
    # it freeing the batch a worker sent (the loop thread's CPU in it: 8.5 ms), and 1 ms
    # of CPU in the wait (receiving); a batch made at num_workers=0 takes 20 ms. The
    # workers' own 43 ms is not used.
    w = waits(LoadStage.HANDOVER, solo_ms=43.0, alone_ms=20.0, alone_runs=12, release_ms=8.0)
    thread = LoopThread(wait_cpu_ms=1.0, compute_cpu_ms=8.5, compute_runq_ms=9.0)
    said, gain, fix = handover_fix(w, 64e6, 45.0, 23.0, 2, thread) or ("", None, {})
    assert fix == {"num_workers": 0}
    assert gain is not None and gain.value == pytest.approx(
        45.0 / (23.0 + 1.0 - 9.0 - 8.0 + 20.0), 0.01
    )
    assert "at num_workers=0 (timed over 12 batches" in said
    assert "9.0 ms waiting for a CPU and 8.0 ms freeing" in said


def test_a_trainer_that_frees_the_batch_in_its_fetch_keeps_its_compute():
    # Lightning lets the batch go in its fetch: the wait's CPU holds the freeing (9.4 ms,
    # 8 of it the freeing), the compute only its own 1.2 ms; the rest of the step at
    # num_workers=0 is the compute and the fetch's own 1.4 ms, less the 1.2 ms run queue.
    w = waits(LoadStage.HANDOVER, alone_ms=20.0, alone_runs=12, release_ms=8.0)
    thread = LoopThread(wait_cpu_ms=9.4, compute_cpu_ms=1.2, compute_runq_ms=1.2)
    _, gain, _ = handover_fix(w, 64e6, 48.6, 7.7, 2, thread) or ("", None, {})
    expected = 48.6 / (7.7 + 9.4 - 1.2 - 8.0 + 20.0)
    assert gain is not None and gain.value == pytest.approx(expected, 0.01)


def test_the_waits_own_run_queue_is_not_taken_from_the_step_kept():
    # watch's loop thread also waited 3 ms for a CPU inside next(): that time is in the
    # wait, not in the compute and the wait's CPU kept, so the thread's record does not
    # carry it and only the compute's 16 ms is taken (taking both, the 64 MB hand-over
    # beside a CPU burner kept 2-3 ms of a 5 ms step: 1.50x for 1.30x).
    w = waits(LoadStage.HANDOVER, alone_ms=50.0, alone_runs=12, release_ms=11.0)
    thread = LoopThread(wait_cpu_ms=1.5, compute_cpu_ms=10.5, compute_runq_ms=16.0)
    assert "wait_runq_ms" not in LoopThread.__dataclass_fields__
    said, gain, _ = handover_fix(w, 64e6, 75.0, 32.5, 2, thread) or ("", None, {})
    kept = 32.5 + 1.5 - 16.0 - 11.0
    assert gain is not None and gain.value == pytest.approx(75.0 / (kept + 50.0), 0.01)
    assert f"the rest of the step {kept:,.1f} ms" in said and "16.0 ms waiting for a CPU" in said


def test_the_freeing_left_out_is_at_most_the_loop_threads_cpu():
    w = waits(LoadStage.HANDOVER, alone_ms=20.0, alone_runs=12, release_ms=11.0)
    thread = LoopThread(wait_cpu_ms=1.0, compute_cpu_ms=9.0, compute_runq_ms=16.0)
    _, gain, _ = handover_fix(w, 64e6, 60.0, 30.0, 2, thread) or ("", None, {})
    expected = 60.0 / (30.0 + 1.0 - 16.0 - 10.0 + 20.0)
    assert gain is not None and gain.value == pytest.approx(expected, 0.01)
    # No CPU figures (a stored report): nothing freed is left out, the lower figure.
    _, gain, _ = handover_fix(w, 64e6, 60.0, 30.0, 2, LoopThread(compute_runq_ms=16.0)) or (
        "",
        None,
        {},
    )
    assert gain is not None and gain.value == pytest.approx(60.0 / (30.0 - 16.0 + 20.0), 0.01)


def test_num_workers_0_timed_and_no_faster_is_said_with_no_figure():
    w = waits(LoadStage.HANDOVER, solo_ms=8.0, alone_ms=40.0, alone_runs=12, release_ms=1.0)
    thread = LoopThread(compute_cpu_ms=1.0)
    said, gain, fix = handover_fix(w, 64e6, 45.0, 6.0, 2, thread) or ("", None, {})
    assert fix == {} and "would not be faster: a batch takes 40.0 ms" in said
    assert gain is not None and gain.kind is GainKind.STEP_SHARE
    assert "loader --factory" not in said  # measured: no need to send the user there


def test_a_step_the_workers_costs_would_empty_gets_no_figure():
    # Less than nothing left: the figures disagree, and no speed-up is promised.
    w = waits(LoadStage.HANDOVER, alone_ms=5.0, alone_runs=12, release_ms=10.0)
    thread = LoopThread(compute_cpu_ms=10.0, compute_runq_ms=5.0)
    _, gain, fix = handover_fix(w, 64e6, 45.0, 12.0, 2, thread) or ("", None, {})
    assert fix == {} and gain is not None and gain.kind is GainKind.STEP_SHARE


def test_start_up_is_judged_over_the_steps_split_where_the_loop_says_their_mean():
    # A trainer's first pass is not split (its workers start before any hook) and paid
    # no visible start-up: the loop's mean step of 30 ms has it in; the split's own
    # steps average 40 ms, 32 of them start-up, so 8 ms without it and 38 ms in a
    # later pass.
    w = waits(LoadStage.STARTUP, startup_s=3.5, restart_ms=30.0, step_ms=40.0)
    _, gain, _ = startup_fix(w, 30.0, 2, "fork") or ("", None, {})
    assert gain is not None and gain.value == pytest.approx(38.0 / 8.0, abs=0.01)


def test_the_split_carries_the_mean_step_over_its_own_steps():
    from array import array

    from starvecheck.loop.splits import StageSplit

    split = StageSplit()
    for step in range(1, 4):  # step 0 (the first pass's) carries no record
        split.put(step, [0.001 * step] + [0.0] * 6, [0.0] * 7)
    waits = array("d", [0.5, 0.001, 0.002, 0.003])
    computes = array("d", [0.5, 0.009, 0.008, 0.007])
    figures = split.figures(waits, 0, computes)
    assert figures.split_step_ms is not None
    assert figures.split_step_ms.value == pytest.approx(10.0)  # (1+9, 2+8, 3+7) ms
    assert split.figures(waits, 0).split_step_ms is None


def test_start_up_over_the_later_passes_is_their_steady_step_and_a_first_batch_a_pass():
    # Later passes of 16 steps averaging 200 ms, 12 ms a step but at a pass's first; a
    # worker already there makes a batch in 8 ms: 12 + 8 / 16 = 12.5 ms a step.
    w = waits(
        LoadStage.STARTUP, startup_s=2.7, restart_ms=180.0, solo_ms=8.0, step_ms=190.0,
        later_step_ms=200.0, later_steady_ms=12.0, later_pass_steps=16.0,
    )  # fmt: skip
    _, gain, fix = startup_fix(w, 150.0, 2, "forkserver") or ("", None, {})
    assert fix == {"persistent_workers": True}
    assert gain is not None and gain.value == pytest.approx(200.0 / 12.5, abs=0.01)
    assert "from 200.0 ms to 12.5 ms" in gain.basis and "16 steps" in gain.basis
    # A figure missing (no batch made alone): the start-up's exposed share, as before.
    w = waits(LoadStage.STARTUP, restart_ms=30.0, step_ms=40.0, later_step_ms=200.0,
              later_steady_ms=12.0, later_pass_steps=16.0)  # fmt: skip
    _, gain, _ = startup_fix(w, 30.0, 2, "fork") or ("", None, {})
    assert gain is not None and gain.value == pytest.approx(38.0 / 8.0, abs=0.01)


def test_the_split_carries_the_later_passes_steps():
    from array import array

    from starvecheck.loop.splits import StageSplit

    split = StageSplit(pass_starts=[0, 3, 6], persistent=False)
    for step in range(0, 9):
        split.put(step, [0.001] + [0.0] * 6, [0.0] * 7)
    # passes of 3 steps; each later pass's first waits 0.1 s
    waits = array("d", [0.5, 0.001, 0.001, 0.1, 0.001, 0.001, 0.1, 0.001, 0.001])
    computes = array("d", [0.009] * 9)
    f = split.figures(waits, 1, computes)
    assert f.later_step_ms is not None and f.later_steady_ms is not None
    assert f.later_step_ms.value == pytest.approx((2 * 109 + 4 * 10) / 6)
    assert f.later_steady_ms.value == pytest.approx(10.0)
    assert f.later_pass_steps is not None and f.later_pass_steps.value == pytest.approx(3.0)
    # written and read back as the record's own
    from starvecheck.core.schema.loading import LoadFigures

    assert LoadFigures.from_metrics(f.to_metrics()) == f
    # persistent workers: no restart, none of these
    kept = StageSplit(pass_starts=[0, 3, 6], persistent=True)
    kept.exposed = split.exposed
    assert kept.figures(waits, 1, computes).later_step_ms is None


def test_the_steady_step_leaves_out_a_pass_s_last_step_where_its_workers_stop():
    """A loop a batch ahead (accelerate's DataLoaderShard) meets the end of a pass inside
    its last step, and the DataLoader's workers stop there (40 ms a pass here, where the
    steps around it take 10): persistent workers never stop, so the steady step, what a
    pass's steps but its first cost with them, leaves that step out. The run's last step
    ends its pass only where the pass ran as long as the one before."""
    from array import array

    from starvecheck.loop.splits import StageSplit

    split = StageSplit(pass_starts=[0, 4, 8], persistent=False)
    for step in range(0, 12):
        split.put(step, [0.001] + [0.0] * 6, [0.0] * 7)
    # passes of 4 steps: each later pass's first waits 0.1 s, each pass's last 0.04 s
    waits = array("d", [0.5, 0.001, 0.001, 0.04, 0.1, 0.001, 0.001, 0.04, 0.1, 0.001,
                        0.001, 0.04])  # fmt: skip
    computes = array("d", [0.009] * 12)
    f = split.figures(waits, 1, computes)
    assert f.later_steady_ms is not None and f.later_step_ms is not None
    assert f.later_steady_ms.value == pytest.approx(10.0)
    assert f.later_step_ms.value == pytest.approx((2 * 109 + 2 * 49 + 4 * 10) / 8)
    # the run cut short in its last pass: its last step is an ordinary one, kept
    f = split.figures(waits[:11], 1, computes[:11])
    assert f.later_steady_ms is not None
    assert f.later_steady_ms.value == pytest.approx(10.0)
    cut = array("d", [*waits[:10], 0.02])
    f = split.figures(cut, 1, computes[:11])
    assert f.later_steady_ms is not None
    assert f.later_steady_ms.value == pytest.approx((3 * 10.0 + 29.0) / 4)


def test_the_later_passes_steps_count_a_pass_start_that_was_not_split():
    """A trainer one batch ahead at num_workers=0 (accelerate's DataLoaderShard) made each
    pass's first batch before its first wait: that step carries no split, but it is
    still the later passes' own, restart and all."""
    from array import array

    from starvecheck.loop.splits import StageSplit

    split = StageSplit(pass_starts=[0, 3, 6], persistent=None)
    for step in range(0, 9):
        if step not in (3, 6):  # the passes' first steps: no record
            split.put(step, [0.001] + [0.0] * 6, [0.0] * 7)
    waits = array("d", [0.5, 0.001, 0.001, 0.1, 0.001, 0.001, 0.1, 0.001, 0.001])
    computes = array("d", [0.009] * 9)
    f = split.figures(waits, 1, computes)
    assert f.later_pass_steps is not None and f.later_pass_steps.value == pytest.approx(3.0)
    assert f.later_step_ms is not None and f.later_steady_ms is not None
    assert f.later_step_ms.value == pytest.approx((2 * 109 + 4 * 10) / 6)
    assert f.later_steady_ms.value == pytest.approx(10.0)
