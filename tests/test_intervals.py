"""The Wilson score interval (core/intervals.py) against published values, and the
rule it feeds: which side of a threshold a share lies on, and how many samples would
decide it; what time-ordered samples are worth (their runs), against a case worked by
hand, a chain whose share is known, independent samples, and garbage."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.core.intervals import (
    Z95,
    effective_samples,
    interval,
    percent,
    samples_needed,
    side,
    t95,
    wilson,
    wilson_effective,
    worth,
)


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


def _chain(rng, n, p_up, p_down):
    """A two-state chain's samples: yes follows no with p_up, no follows yes with
    p_down (runs of yes 1/p_down long on average); its share in the long run is
    p_up / (p_up + p_down)."""
    x, state = [], rng.random() < p_up / (p_up + p_down)
    for _ in range(n):
        x.append(state)
        state = (rng.random() >= p_down) if state else (rng.random() < p_up)
    return x


def test_the_worth_of_a_known_series_by_hand():
    # runs [1,1,1,1,0,0] and [1,0,0,0,0,0]: p = 5/12, each run's yes less p x its
    # samples +1.5 and -1.5; variance 2/1 x (1.5^2 + 1.5^2) / 12^2 = 0.0625; worth
    # p(1-p) / 0.0625 = 3.89 draws
    w = worth([1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0])
    assert w.samples == 12 and w.runs == 2
    assert w.effective == pytest.approx(5 / 12 * 7 / 12 / 0.0625)
    # runs of yes 2.5 long where a coin's would be 1/(1 - 5/12) = 1.71: clustered
    # 1 - 1.71/2.5, and the t distribution's point for one degree of freedom that far
    assert w.clustered == pytest.approx(1 - 1 / (7 / 12 * 2.5))
    assert w.z == pytest.approx(Z95 + (12.706 - Z95) * w.clustered)


def test_a_few_lone_yes_keep_wilsons_multiplier():
    # one sample of 248 waiting: two runs, but no run of yes longer than a coin's
    x = [False] * 10 + [True] + [False] * 237
    w = worth(x)
    assert w.runs == 2 and w.clustered == 0 and w.z == Z95


def test_t95_against_its_table():
    assert t95(1) == 12.706 and t95(10) == 2.228
    assert t95(20) == pytest.approx(2.086, abs=1e-3)
    assert t95(60) == pytest.approx(2.000, abs=1e-3)
    assert t95(10_000) == pytest.approx(Z95, abs=1e-3)


def test_independent_samples_are_worth_about_all_of_them_and_keep_wilsons_interval():
    rng = random.Random(7)
    for share in (0.03, 0.3, 0.7):
        hits = [rng.random() < share for _ in range(2000)]
        w = worth(hits)
        assert w.effective >= 0.85 * 2000
        a, b = interval(sum(hits), 2000, w)
        wa, wb = wilson(sum(hits), 2000)
        assert a == pytest.approx(wa, abs=0.01) and b == pytest.approx(wb, abs=0.01)


def test_the_interval_holds_a_chains_share_95_times_in_100_where_wilsons_does_not():
    """The maths against a known case: long runs (a wait 8 samples long on average, 20
    between), 200-sample windows (about seven runs each): the chain's long-run share
    is known, 5/14. Wilson's interval on every sample holds it in about half."""
    rng = random.Random(11)
    p = (1 / 20) / (1 / 20 + 1 / 8)
    held = held_wilson = 0
    for _ in range(300):
        x = _chain(rng, 200, 1 / 20, 1 / 8)
        a, b = interval(sum(x), 200, worth(x))
        held += a <= p <= b
        wa, wb = wilson(sum(x), 200)
        held_wilson += wa <= p <= wb
    assert held >= 0.90 * 300
    assert held_wilson <= 0.70 * 300


def test_runs_as_long_as_each_other_are_worth_every_sample():
    # six samples of a wait, fourteen of the step, ten times: the share moves only
    # with whole runs, and every run is the same: 30% is known as well as Wilson's says
    w = worth(([True] * 6 + [False] * 14) * 10)
    assert w.effective == 200 and w.runs == 10


def test_runs_of_very_different_lengths_are_worth_a_few_and_widen_the_interval():
    # waits of 2 and 30 samples between 10 of the step: the share moves with which
    # came; the interval wider than Wilson's on every sample, and still holds it
    x = ([True] * 2 + [False] * 10 + [True] * 30 + [False] * 10) * 4
    w = worth(x)
    assert 2 <= w.effective <= 40
    low, high = interval(sum(x), len(x), w)
    wide_low, wide_high = wilson(sum(x), len(x))
    assert low < wide_low and high > wide_high
    assert low < sum(x) / len(x) < high


def test_the_edges_of_a_series():
    assert effective_samples([False] * 50) == 50  # nothing seen waiting: Wilson's at 0
    assert effective_samples([True] * 50) == 1  # one wait as long as the window
    assert effective_samples([True] * 5, [True] * 5, [True] * 5) == 3  # each series one
    # one run, at the start: one wait seen, in a window of ten of its length
    assert effective_samples([True] * 5 + [False] * 45) == 10
    assert effective_samples([True] + [False] * 399) == 400  # a lone sample: a coin's
    assert effective_samples([True, False] * 25) == 50  # never more than the samples
    assert effective_samples([]) == 0 and effective_samples([True]) == 1
    # a sample counted in part (a weight), and garbage weights read as none
    assert worth([0.5, 0.5, 0.0, 0.0]).runs == 1
    assert worth([float("nan"), -3.0, 1.0, 0.0]).runs == 2  # the none before, the yes


def test_several_series_pool_their_runs():
    one = [True] * 3 + [False] * 7
    w = worth(one, one, one)
    assert w.samples == 30 and w.runs == 3 and w.effective == 30


@given(st.lists(st.booleans(), max_size=400))
def test_property_the_effective_count_is_between_one_and_the_samples(hits):
    eff = effective_samples(hits)
    assert (len(hits) == 0 and eff == 0) or 1 <= eff <= len(hits)
    low, high = wilson_effective(sum(hits), len(hits), eff)
    share = sum(hits) / len(hits) if hits else 0.0
    assert 0 <= low <= high <= 1
    if hits:
        assert low <= share <= high


@given(
    st.lists(
        st.lists(
            st.one_of(
                st.floats(allow_nan=True, allow_infinity=True),
                st.booleans(),
                st.integers(-5, 5),
            ),
            max_size=60,
        ),
        max_size=5,
    )
)
def test_property_garbage_series_give_a_worth_and_an_interval_inside_0_1(series):
    w = worth(*series)
    n = sum(len(s) for s in series)
    assert w.samples == n and 0 <= w.runs <= n
    assert (n == 0 and w.effective == 0) or 1 <= w.effective <= n
    assert math.isfinite(w.z) and w.z >= Z95
    hits = sum(min(1.0, max(0.0, float(v))) for s in series for v in s if math.isfinite(float(v)))
    low, high = interval(hits, n, w)
    assert 0 <= low <= high <= 1
    if n:
        assert low <= hits / n <= high


def test_the_window_that_would_decide():
    from starvecheck.core.intervals import Worth, seconds_to_decide

    # 8 independent samples a second of a 12% share: Wilson's count that decides 5%,
    # found on a grid a fifth of a doubling fine
    need = samples_needed(0.12, 0.05)
    t = seconds_to_decide(0.12, Worth(8, 8.0, 8), 1.0, 0.05)
    assert t is not None and need / 8 <= t <= need / 8 * 2**0.2 + 1
    assert seconds_to_decide(0.05, Worth(8, 8.0, 8), 1.0, 0.05) is None  # at the line
    # the same samples worth a tenth as much, in a few long runs: a far longer window
    runs = seconds_to_decide(0.12, Worth(80, 8.0, 3, 0.9), 10.0, 0.05)
    assert runs is not None and runs > 10 * t
