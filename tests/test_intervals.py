"""The Wilson score interval (core/intervals.py) against published values, and the
rule it feeds: which side of a threshold a share lies on, and how many samples would
decide it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.core.intervals import percent, samples_needed, side, wilson


@pytest.mark.parametrize(
    ("hits", "n", "low", "high"),
    [
        # Newcombe (1998), Statistics in Medicine 17:857, table I, method 3 (Wilson).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        # the example: 400 samples of a 68% share is about +-5 points
        (272, 400, 0.6328, 0.7238),
    ],
)
def test_known_values(hits, n, low, high):
    a, b = wilson(hits, n)
    assert a == pytest.approx(low, abs=1e-4) and b == pytest.approx(high, abs=1e-4)


def test_no_samples_is_nothing_known_and_all_hits_stays_inside_one():
    assert wilson(0, 0) == (0.0, 1.0)
    a, b = wilson(8, 8)
    assert b == 1.0 and 0.6 < a < 0.7  # 8 of 8: 68-100%
    assert percent(0.6327, 0.724) == "63-72%"


def test_side_of_a_threshold_and_the_samples_that_decide_it():
    assert side(*wilson(272, 400), 0.20) == 1
    assert side(*wilson(1, 400), 0.05) == -1
    assert side(*wilson(1, 8), 0.05) is None  # 12% of 8 samples: could be 2% or 47%
    n = samples_needed(0.12, 0.05)
    assert side(*wilson(0.12 * n, n), 0.05) == 1
    assert side(*wilson(0.12 * (n - 1), n - 1), 0.05) is None
    assert samples_needed(0.05, 0.05) == 1_000_000


@given(st.integers(0, 10_000), st.integers(1, 10_000))
def test_property_the_interval_holds_the_share(hits, n):
    hits = min(hits, n)
    a, b = wilson(hits, n)
    assert 0.0 <= a <= hits / n <= b <= 1.0


def test_independent_samples_are_worth_about_all_of_them():
    import random

    from starvecheck.core.intervals import effective_samples

    rng = random.Random(7)
    hits = [rng.random() < 0.3 for _ in range(2000)]
    assert 0.85 * 2000 <= effective_samples(hits) <= 2000


def test_a_wait_that_comes_in_runs_is_worth_its_runs():
    from starvecheck.core.intervals import effective_samples, wilson_effective

    # six samples of one 300 ms wait, fourteen of the step, ten times: 200 samples
    runs = ([True] * 6 + [False] * 14) * 10
    eff = effective_samples(runs)
    assert 15 <= eff <= 40  # about the 20 runs, never the 200 samples
    low, high = wilson_effective(60, 200, eff)
    wide_low, wide_high = wilson(60, 200)
    assert low < wide_low and high > wide_high  # wider than Wilson on every sample
    assert low < 0.3 < high


def test_a_run_that_never_changes_and_alternating_samples_are_bounded():
    from starvecheck.core.intervals import effective_samples

    assert effective_samples([False] * 50) == 50  # nothing seen waiting: Wilson's at 0
    assert effective_samples([True] * 50) == 1  # one wait as long as the window
    assert effective_samples([True, False] * 25) == 50  # never more than the samples
    assert effective_samples([]) == 0 and effective_samples([True]) == 1


@given(st.lists(st.booleans(), max_size=400))
def test_property_the_effective_count_is_between_one_and_the_samples(hits):
    from starvecheck.core.intervals import effective_samples, wilson_effective

    eff = effective_samples(hits)
    assert (len(hits) == 0 and eff == 0) or 1 <= eff <= len(hits)
    low, high = wilson_effective(sum(hits), len(hits), eff)
    share = sum(hits) / len(hits) if hits else 0.0
    assert 0 <= low <= high <= 1
    if hits:
        assert low <= share <= high
