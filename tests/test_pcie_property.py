"""`pcie --sizes` against garbage: a tuple of sizes within bounds, or one usage line
(exit 2), never a traceback; the overlap ratio stays within 0..1 whatever the
timings, and its verdict keeps the documented thresholds and never reads more overlap
as less."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from starvecheck.cli import args
from starvecheck.core.criteria import overlap_verdict
from starvecheck.core.status import UsageError
from starvecheck.stages.pcie import bandwidth as bw
from tests.conftest import run

SIZEISH = st.sampled_from([*"0123456789.,kKmMgGtTiIbB -", "MiB", "GiB", "1e400", "\n", "\x00"])
sizeish = st.lists(SIZEISH, max_size=30).map("".join)
garbage = st.one_of(st.text(max_size=80), sizeish)


@settings(max_examples=400, deadline=None)
@given(garbage)
def test_sizes_parser_returns_valid_sizes_or_one_usage_line(text):
    try:
        sizes = args.copy_sizes(text)
    except UsageError as e:
        message = str(e)
        assert message.startswith("--sizes ") and "\n" not in message
        return
    assert sizes and list(sizes) == sorted(set(sizes))
    assert all(args.MIN_COPY_SIZE <= s <= args.MAX_COPY_SIZE for s in sizes)
    assert all(bw.size_name(s) for s in sizes)


@settings(max_examples=40, deadline=None)
@given(sizeish)
def test_bad_sizes_on_the_command_line_are_one_line_and_exit_2(text):
    if text.startswith("-"):
        text = "x" + text  # a leading dash reads as an option: a different error
    try:
        args.copy_sizes(text)
    except UsageError as e:
        expected = str(e)
    else:
        assume(False)  # valid sizes would start a measurement
    r = run("pcie", "--sizes", text)
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [f"starvecheck: error: {expected}"]


seconds = st.floats(min_value=0, max_value=10, allow_nan=False)
fractions = st.floats(min_value=0, max_value=1, allow_nan=False)

# Worst to best: more overlap never reads as a worse verdict.
ORDER = ["SEQUENTIAL", "PARTIAL", "PARALLEL"]


@settings(max_examples=300, deadline=None)
@given(seconds, seconds, seconds)
def test_overlap_ratio_is_a_fraction_or_unknown(cpu, copy, both):
    o = bw.Overlap(cpu, copy, both)
    ratio = o.ratio
    assert ratio is None or 0.0 <= ratio <= 1.0
    # Unknown exactly when the shorter of the two is too short to tell (a hair
    # either side of the limit, floats may round the gap either way).
    shorter = min(cpu, copy)
    if abs(shorter - bw.MIN_OVERLAP_GAP_S) > 1e-9:
        assert (ratio is None) == (shorter < bw.MIN_OVERLAP_GAP_S)
    assert (overlap_verdict(ratio) == "UNKNOWN") == (ratio is None)


@settings(max_examples=300, deadline=None)
@given(fractions, fractions)
def test_a_higher_ratio_never_reads_as_less_overlap(a, b):
    low, high = sorted((a, b))
    assert ORDER.index(overlap_verdict(low)) <= ORDER.index(overlap_verdict(high))


@settings(max_examples=300, deadline=None)
@given(seconds, seconds, seconds, seconds)
def test_finishing_both_sooner_never_reads_as_less_overlap(cpu, copy, both, other):
    """The same copy and CPU work done together in less time overlapped at least as
    much: its ratio is no lower and its verdict no worse."""
    sooner, later = sorted((both, other))
    a, b = bw.Overlap(cpu, copy, sooner).ratio, bw.Overlap(cpu, copy, later).ratio
    assume(a is not None and b is not None)
    assert a >= b
    assert ORDER.index(overlap_verdict(a)) >= ORDER.index(overlap_verdict(b))


def test_the_thresholds_sit_where_the_docs_say():
    """docs/commands/pcie.md: PARALLEL at 0.8 or more, SEQUENTIAL at 0.2 or less,
    PARTIAL between; each threshold belongs to the verdict it names."""
    assert overlap_verdict(None) == "UNKNOWN"
    assert overlap_verdict(0.0) == "SEQUENTIAL"
    assert overlap_verdict(0.2) == "SEQUENTIAL"
    assert overlap_verdict(math.nextafter(0.2, 1)) == "PARTIAL"
    assert overlap_verdict(0.5) == "PARTIAL"
    assert overlap_verdict(math.nextafter(0.8, 0)) == "PARTIAL"
    assert overlap_verdict(0.8) == "PARALLEL"
    assert overlap_verdict(1.0) == "PARALLEL"


@pytest.mark.parametrize(
    "cpu, copy, both, ratio, verdict",
    [
        (1.0, 1.0, 1.0, 1.0, "PARALLEL"),  # the copy wholly hidden
        (1.0, 1.0, 2.0, 0.0, "SEQUENTIAL"),  # one after the other
        (1.0, 1.0, 1.5, 0.5, "PARTIAL"),
        (1.0, 0.25, 1.05, 0.8, "PARALLEL"),  # 0.7999999999999998 in floats: rounded
        (1.0, 0.25, 1.2, 0.2, "SEQUENTIAL"),
        (1.0, 0.25, 1.1, 0.6, "PARTIAL"),
        (1.0, 1.0, 3.0, 0.0, "SEQUENTIAL"),  # slower than one after the other
        (1.0, 1.0, 0.9, 1.0, "PARALLEL"),  # faster than the ideal: noise, clamped
        (1.0, 0.0004, 1.0, None, "UNKNOWN"),  # a copy too short to tell
    ],
)
def test_known_overlaps(cpu, copy, both, ratio, verdict):
    o = bw.Overlap(cpu, copy, both)
    assert o.ratio == (None if ratio is None else pytest.approx(ratio, abs=1e-9))
    assert overlap_verdict(o.ratio) == verdict
