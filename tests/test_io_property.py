"""Garbage in, no exception out: the parsers behind `io`'s options, and the throughput
table's reading of metric labels."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from starvecheck.cli.args import thread_counts as _threads
from starvecheck.core.metric import Metric
from starvecheck.core.status import UsageError
from starvecheck.core.units import parse_size
from starvecheck.render import throughput

SETTINGS = settings(max_examples=300, deadline=None)

# Text shaped like sizes: digits, dots, unit letters and blanks, plus anything.
SIZE_ALPHABET = st.sampled_from([*"0123456789.  kKmMgGtTiIbBeE+-_,", "\t", "١", "K"])
size_text = st.text(SIZE_ALPHABET, max_size=30) | st.text(max_size=30)
size_shaped = st.builds(
    lambda num, frac, unit, i, b, pad: f"{pad}{num}{frac}{unit}{i}{b}{pad}",
    st.integers(0, 10**12).map(str),
    st.sampled_from(["", ".5", ".25", ".0"]),
    st.sampled_from(["", "k", "K", "m", "M", "g", "G", "t", "T"]),
    st.sampled_from(["", "i"]),
    st.sampled_from(["", "b", "B"]),
    st.sampled_from(["", " ", "\t"]),
)


@SETTINGS
@given(size_text | size_shaped)
def test_parse_size_returns_none_or_a_non_negative_int(text):
    value = parse_size(text)
    assert value is None or (type(value) is int and value >= 0)


@SETTINGS
@given(st.integers(0, 10**9), st.sampled_from([("", 1), ("K", 1024), ("MiB", 1 << 20)]))
def test_parse_size_multiplies_whole_numbers_exactly(n, unit):
    suffix, mult = unit
    assert parse_size(f"{n}{suffix}") == n * mult
    assert parse_size(f" {n} {suffix.lower()} ") == n * mult


@settings(max_examples=50, deadline=None)
@given(st.integers(309, 400), st.sampled_from(["", "K", "T"]))
@example(400, "")
def test_parse_size_never_raises_on_huge_numbers(digits, unit):
    value = parse_size("9" * digits + unit)
    assert value is None or value >= 0


thread_item = st.one_of(
    st.integers(-5, 2000).map(str),
    st.sampled_from(["", " ", "x", "1.5", "+3", " 4 ", "0x10", "1_0", "٣", "inf"]),
    st.text(max_size=5),
)
thread_text = st.lists(thread_item, max_size=8).map(",".join) | st.text(max_size=20)


@SETTINGS
@given(thread_text, st.one_of(st.none(), st.integers(-2, 4096)))
def test_threads_is_sorted_unique_in_range_or_a_usage_error(text, effective):
    try:
        got = _threads(text, effective)
    except UsageError as e:
        assert str(e).startswith("--threads ")
        return
    assert isinstance(got, tuple) and got
    assert all(type(v) is int and 1 <= v <= 1024 for v in got)
    assert list(got) == sorted(set(got))


@SETTINGS
@given(st.lists(st.integers(1, 1024), min_size=1, max_size=8))
def test_threads_keeps_every_valid_count(values):
    assert _threads(",".join(map(str, values)), 2) == tuple(sorted(set(values)))


@given(st.one_of(st.none(), st.integers(-2, 4096)))
def test_threads_default_is_one_and_the_cpu_count(effective):
    got = _threads(None, effective)
    assert got[0] == 1 and got[-1] == max(1, effective or 1) and len(set(got)) == len(got)


name_part = st.sampled_from(
    [
        *("small_files", "shard", "random", "sequential", "cold", "warm"),
        *("t2", "t16", "t", "t0", "t007"),
        *throughput.COMPANIONS,
    ]
) | st.text(max_size=6)
metric_name = st.lists(name_part, min_size=1, max_size=6).map(".".join) | st.text(max_size=30)
unit = st.sampled_from(["MB/s", "samples/s", "ms", "fraction", ""])
value = st.one_of(
    st.none(), st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e12)
)
# Labels as io gives them, and partial or odd ones: the table reads labels, not names.
labels = st.fixed_dictionaries(
    {},
    optional={
        "quantity": st.sampled_from(["mb_per_s", *throughput.COMPANIONS, "resident_before"])
        | st.text(max_size=6),
        "layout": st.sampled_from(["small_files", "shard", "files"]) | st.text(max_size=6),
        "pattern": st.sampled_from(["random", "sequential"]),
        "cache": st.sampled_from(["cold", "warm"]),
        "threads": st.integers(0, 10**6),
    },
)


@st.composite
def metrics(draw):
    names = draw(st.lists(metric_name, max_size=12, unique=True))
    out = []
    for name in names:
        v = draw(value)
        where = draw(labels)
        if v is None:
            out.append(Metric.missing(name, draw(unit), "reason", where))
        elif draw(st.booleans()):
            out.append(Metric.repeated(name, [v, v * 2], draw(unit), where))
        else:
            out.append(Metric(name, v, draw(unit), labels=where))
    return tuple(out)


@pytest.mark.slow
@SETTINGS
@given(metrics())
def test_split_never_raises_and_accounts_for_every_metric(ms):
    rows, rest = throughput.split(ms)
    rates = [r.rate.name for r in rows]
    companions = [c.name for r in rows for c in r.companions.values()]
    others = [m.name for m in rest]
    shown = rates + companions + others
    assert sorted(shown) == sorted(m.name for m in ms)  # each metric exactly once
    order = [m.name for m in ms]
    assert others == [n for n in order if n in set(others)]  # the stage's order kept
    assert rates == [n for n in order if n in set(rates)]
    for r in rows:
        assert r.rate.labels["quantity"] == "mb_per_s" and "pattern" in r.rate.labels
        assert r.temp in ("cold", "warm") and r.threads >= 0
        assert len(r.cells()) == len(throughput.HEADERS)
    throughput.missing_reasons(rows)
