from __future__ import annotations

import itertools

import pytest

from starvecheck.stages.timing import mad, outliers, percentile, repeat, stability_warnings


def test_repeat_separates_warmups_with_a_fake_clock():
    ticks = itertools.count()
    calls = []
    timed = repeat(lambda: calls.append(1), runs=3, warmups=2, clock=lambda: next(ticks) * 0.5)
    assert len(calls) == 5
    assert timed.warmups == (0.5, 0.5) and timed.values == (0.5, 0.5, 0.5)


def test_repeat_rejects_no_runs():
    with pytest.raises(ValueError):
        repeat(lambda: None, runs=0)


def test_mad_and_outliers():
    values = [10.0, 10.1, 9.9, 10.0, 25.0]
    assert mad(values) == pytest.approx(0.1)
    assert outliers(values) == [4]
    assert outliers([1.0, 1.0, 1.0]) == []
    # Too few values to call one an outlier: two equal values and a third would be.
    assert outliers([1.0, 1.0, 2.0]) == []
    assert outliers([1.0, 1.0, 1.0, 1.0, 2.0]) == [4]


def test_percentile_interpolates_between_ranks():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)  # numpy.percentile(..., 90)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_stability_warnings():
    assert stability_warnings([1.0, 1.01, 0.99, 1.0]) == []
    assert "too few" in stability_warnings([1.0, 2.0])[0]
    noisy = stability_warnings([1.0, 1.5, 0.6, 1.2])
    assert any("vary by" in w for w in noisy)
    assert stability_warnings([]) == ["no runs completed"]
