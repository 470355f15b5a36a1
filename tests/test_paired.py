"""Configurations compared round by round (core/paired.py, core/criteria.py): the
ratio of two figures read side by side, its interval, and the rules built on them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starvecheck.core.criteria import cpu_work, paired_knee, ratios
from starvecheck.core.paired import MARGIN, chained, compare, spread

rates = st.lists(st.floats(1.0, 1e6), min_size=2, max_size=8)


def test_a_ratio_read_side_by_side_holds_where_the_figures_do_not():
    # The machine slowed round 2 threefold for both: their ratio stays 1.5.
    a, b = [150.0, 50.0, 150.0], [100.0, 33.333, 100.0]
    c = compare(a, b)
    assert c is not None and c.ratio == pytest.approx(1.5, rel=1e-3)
    assert c.low == pytest.approx(1.5, rel=1e-3) and c.clears()
    assert spread(a) == pytest.approx(3.0)  # each figure alone moved 3x


def test_a_gain_inside_the_noise_does_not_clear_the_margin():
    c = compare([104.0, 96.0, 106.0], [100.0, 100.0, 100.0])
    assert c is not None and 0.98 < c.ratio < 1.05
    assert not c.clears() and not c.below()
    assert "over 3 rounds" in c.describe()


def test_more_rounds_of_the_same_spread_narrow_the_interval():
    short = compare([110.0, 102.0, 112.0], [100.0] * 3)
    long = compare([110.0, 102.0, 112.0] * 3, [100.0] * 9)
    assert short is not None and long is not None
    assert long.high - long.low < short.high - short.low
    # The shorter run may fail to clear where the longer clears: never the reverse.
    assert not short.clears() and long.clears()


def test_a_round_in_which_one_configuration_stalled_does_not_set_the_figure():
    # Round 2: num_workers=0 stalled behind other work (3 samples/s): that round's ratio
    # is 1,000x; the figure is the rounds' median, and the stall only widens the interval.
    c = compare([300.0, 3000.0, 290.0, 310.0, 300.0], [100.0, 3.0, 100.0, 100.0, 100.0])
    assert c is not None and c.ratio == pytest.approx(3.0)
    steady = compare([300.0, 300.0, 290.0, 310.0, 300.0], [100.0] * 5)
    assert steady is not None and c.high > steady.high and c.low <= c.ratio


def test_one_round_has_no_interval_and_never_clears():
    c = compare([200.0], [100.0])
    assert c is not None and c.ratio == 2.0 and not c.clears()
    assert "no interval" in c.describe()
    assert compare([], []) is None and compare([1.0], [0.0]) is None


def test_chained_comparisons_multiply():
    c = chained(compare([120.0] * 3, [100.0] * 3), compare([300.0] * 3, [100.0] * 3))
    assert c.ratio == pytest.approx(3.6) and c.low == pytest.approx(3.6)


@given(rates, st.floats(0.1, 10.0))
def test_property_a_constant_ratio_is_found_whatever_the_machine_does(b, k):
    a = [x * k for x in b]
    c = compare(a, b)
    assert c is not None and c.ratio == pytest.approx(k, rel=1e-6)
    assert c.low == pytest.approx(k, rel=1e-6) and c.high == pytest.approx(k, rel=1e-6)


@given(rates, rates)
def test_property_the_interval_holds_the_ratio_and_swapping_inverts_it(a, b):
    c, d = compare(a, b), compare(b, a)
    assert c is not None and d is not None
    assert c.low <= c.ratio <= c.high
    assert c.ratio * d.ratio == pytest.approx(1.0, rel=1e-6)
    assert c.low * d.high == pytest.approx(1.0, rel=1e-6)
    assert not (c.clears(MARGIN) and c.below(MARGIN))


def test_paired_knee_takes_the_fewest_counts_within_five_percent_round_by_round():
    rounds = {0: [400.0, 200.0, 400.0], 1: [700.0, 350.0, 700.0], 2: [980.0, 490.0, 980.0]}
    rounds[4] = [1000.0, 500.0, 1000.0]
    assert paired_knee(rounds, 4) == 2  # 2 is 0.98x of 4, round by round
    assert paired_knee(rounds, 2) == 2 and paired_knee(rounds, 1) == 1
    assert paired_knee({}, 2) is None
    assert ratios([2.0, 4.0], [1.0, 0.0]) == [2.0]


def test_a_fewer_count_is_as_good_only_where_the_rounds_show_it():
    # A busy machine: 1 worker's median ratio to 2's is 0.96, but its rounds range
    # from 0.70 to 1.25: the interval's low end is far under 0.90, so 2 stands.
    busy = {1: [700.0, 960.0, 1250.0], 2: [1000.0, 1000.0, 1000.0]}
    assert paired_knee(busy, 2) == 2
    # The same median, rounds that agree: 1 is as good as 2 on evidence.
    quiet = {1: [950.0, 960.0, 970.0], 2: [1000.0, 1000.0, 1000.0]}
    assert paired_knee(quiet, 2) == 1
    # A tie on a busy machine whose median happens to favour 1: not settled by the
    # median's luck, but towards the more workers, as the run above settles it.
    assert paired_knee({1: [1250.0, 1040.0, 700.0], 2: [1000.0, 1000.0, 1000.0]}, 2) == 2
    # More workers whose median is well under the best's are not named for a wide
    # interval: 1 worker read 0.73x of none, rounds from 0.45x to 1.2x (a busy machine).
    wide = {0: [3583.0, 3000.0, 4100.0], 1: [2621.0, 3600.0, 1850.0]}
    assert paired_knee(wide, 2) == 0
    # More workers clearly slower (oversubscribed) are never the count settled on.
    over = {1: [700.0, 710.0, 690.0], 2: [1000.0, 990.0, 1010.0], 4: [800.0, 790.0, 810.0]}
    assert paired_knee(over, 4) == 2
    # One round: no interval, the median decides (as before rounds were paired).
    assert paired_knee({1: [960.0], 2: [1000.0]}, 2) == 1


def test_cpu_work_reads_waiting_for_a_cpu_as_cpu_work_never_as_io():
    # 1 s alive: 0.2 on a CPU, 0.8 runnable, waiting for one another process held.
    assert cpu_work(0.2, 0.8, 1.0) is True
    # 0.2 on a CPU, 0.8 blocked (storage, sleep): waiting on I/O.
    assert cpu_work(0.2, 0.0, 1.0) is False
    # Not measured: None, which callers take as CPU work.
    assert cpu_work(0.2, None, 1.0) is None and cpu_work(None, 0.0, 1.0) is None
