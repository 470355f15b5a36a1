"""`pcie --sizes` against garbage: a tuple of sizes within bounds, or one usage line
(exit 2), never a traceback; and the overlap ratio stays within 0..1 whatever the
timings."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from starvecheck import args
from starvecheck.stages.pcie import bandwidth as bw
from starvecheck.status import UsageError
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


@settings(max_examples=300, deadline=None)
@given(seconds, seconds, seconds)
def test_overlap_ratio_is_a_fraction_or_unknown(cpu, copy, both):
    ratio = bw.Overlap(cpu, copy, both).ratio
    assert ratio is None or 0.0 <= ratio <= 1.0
    assert bw.verdict(ratio) in {"PARALLEL", "PARTIAL", "SEQUENTIAL", "UNKNOWN"}
