"""Property tests of the batching strategies and of the lengths parser.

Packing never puts more than the context in a row and never loses or duplicates a
sample; the vectorised packers place every sample exactly where the textbook
one-sample-at-a-time algorithms do; the parser meets garbage with a usage error, and
the block reader of --lengths gives what the per-line reader gave on any text.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starvecheck.core.status import UsageError
from starvecheck.core.strategies import SHARES_ROWS, STRATEGIES
from starvecheck.inputs import dataset, streams
from starvecheck.inputs import lengths as lengthsfile
from starvecheck.stages.pad import packing


@st.composite
def cases(draw):
    context = draw(st.integers(1, 300))
    lengths = draw(st.lists(st.integers(1, context), min_size=0, max_size=300))
    batch = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    return np.array(lengths, dtype=np.int64), context, batch, seed


def naive_next_fit(lengths, context):
    rows, used, r = [], 0, 0
    for i, n in enumerate(lengths):
        if i and used + n > context:
            r, used = r + 1, 0
        used += n
        rows.append(r)
    return rows


def naive_fit_decreasing(lengths, context, best):
    """One sample at a time, longest first (ties by index): first row with room, or
    the row with the least room that still fits (ties to the lower row)."""
    room: list[int] = []
    row_of = {}
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        fits = [r for r in range(len(room)) if room[r] >= n]
        if not fits:
            room.append(context)
            target = len(room) - 1
        elif best:
            target = min(fits, key=lambda r: (room[r], r))
        else:
            target = fits[0]
        room[target] -= n
        row_of[i] = target
    return row_of


@settings(max_examples=200, deadline=None)
@given(cases())
def test_every_strategy_places_each_sample_once_within_its_row(case):
    lengths, context, batch, seed = case
    for name in STRATEGIES:
        lay = packing.layout(name, lengths, context, batch, seed)
        assert sorted(lay.order.tolist()) == list(range(lengths.size)), name  # none lost or doubled
        assert np.all(np.diff(lay.row) >= 0), name
        tokens = lay.row_tokens(lengths)
        assert np.all(tokens <= lay.row_len), name
        if name in SHARES_ROWS - {"padding_free"}:
            assert np.all(lay.row_len == context) and np.all(tokens <= context), name
            assert np.all(tokens > 0), name  # no empty rows
        fig = packing.figures(lay, lengths)
        assert fig.tokens == int(lengths.sum())
        assert 0 < fig.efficiency <= 1.0, name
        assert fig.batches == -(-lay.rows // batch)
        ideal = float((lengths.astype(float) ** 2).sum())
        assert fig.attention >= ideal * (1 - 1e-12), name  # nothing beats per-sample attention


@settings(max_examples=200, deadline=None)
@given(cases())
def test_greedy_packing_is_next_fit(case):
    lengths, context, _, _ = case
    assert packing.next_fit_rows(lengths, context).tolist() == naive_next_fit(
        lengths.tolist(), context
    )


@settings(max_examples=200, deadline=None)
@pytest.mark.parametrize("best", [False, True])
@given(case=cases())
def test_fit_decreasing_matches_the_one_at_a_time_algorithm(best, case):
    lengths, context, _, _ = case
    order, row = packing.fit_decreasing(lengths, context, best)
    got = dict(zip(order.tolist(), row.tolist(), strict=True))
    assert got == naive_fit_decreasing(lengths.tolist(), context, best)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_lengths_parser_meets_garbage_with_a_usage_error(text):
    try:
        out = lengthsfile.parse_lengths(text.splitlines(), "x")
    except UsageError as e:
        assert "\n" not in str(e) and str(e).startswith("--lengths x: line ")
    else:
        assert out.dtype == np.int64 and np.all(out >= 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**12), max_size=50))
def test_lengths_parser_reads_what_was_written(values):
    text = "\n".join(["# lengths", *map(str, values), ""])
    assert lengthsfile.parse_lengths(text.splitlines(), "x").tolist() == values


@settings(max_examples=150, deadline=None)
@given(
    st.binary(max_size=400) | st.text(max_size=400).map(str.encode),
    st.sampled_from(["jsonl", "json", "csv", "tsv", "text"]),
    st.sampled_from([(), ("text",), ("a", "b")]),
)
def test_dataset_reader_meets_garbage_with_a_usage_error(tmp_path_factory, data, fmt, fields):
    path = tmp_path_factory.mktemp("garbage") / f"d.{fmt}"
    path.write_bytes(data)
    try:
        samples = dataset.read_samples(str(path), fmt, fields)
    except UsageError as e:
        assert "\n" not in str(e)
    else:
        assert samples.items and all(isinstance(s, str | int | list) for s in samples.items)


# --- the block reader against the per-line reader -----------------------------------

# Characters that make the readers part: digits, blanks, every line end the per-line
# reader knows ("\r" alone too), what str.strip() strips but a file's lines do not end
# at, comments, signs, non-ASCII digits, a byte-order mark mid-file; and numbers around
# MAX_LENGTH, 12 and 13 digits long, and with leading zeros.
_DIGITS = [*"0123456789", *"0123456789"]
_ENDS = [" ", "\t", "\n", "\n", "\n", "\r", "\r\n", " " * 9]
_ODD = ["#", "-", ".", "e", "x", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\xa0", "é"]
_ODD += ["\u0663", "\ufeff", "\x00", "\x1b", "# lengths\n", " #é"]
_NUMBERS = ["999999999999", "1099511627776", "1099511627777", "0000000000000000005"]
_PIECES = st.sampled_from(_DIGITS + _ENDS + _ODD + _NUMBERS)
_TEXTS = st.lists(_PIECES, max_size=120).map("".join) | st.text(max_size=300)


def per_line(data: bytes, cap: int, limit: int | None) -> np.ndarray | str:
    """What the reader before blocks gave: the file's lines one by one (`_lines` over
    the file as `Checked` reads it), each through `parse_lengths`; or its message."""
    f = streams.Checked(io.BytesIO(data), "--lengths x")
    try:
        return lengthsfile.parse_lengths(
            (line for _, line, _ in streams.bounded_lines(f, cap)), "x", limit
        )
    except UsageError as e:
        return str(e)


def blocks(data: bytes, read: int, limit: int | None, **sizes: int) -> np.ndarray | str:
    """What the block reader gives on the same file, read `read` bytes at a time."""
    pieces = streams.text_pieces(io.BytesIO(data), "--lengths x", size=read)
    try:
        return lengthsfile.parse_lengths_text(pieces, "x", limit, **sizes)
    except UsageError as e:
        return str(e)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(
    _TEXTS,
    st.integers(1, 64) | st.just(1 << 20),
    st.none() | st.integers(1, 12),
    st.sampled_from([4, 7, 16, 4096]),
    st.sampled_from([1, 8, 64, 1 << 20]),
    st.sampled_from([1, 16, 8192]),
)
def test_the_block_reader_gives_what_the_per_line_reader_gave(text, read, limit, cap, long, small):
    # The same counts, or the same message (the same line), on any text read in pieces,
    # with lines cut short (cap), long stretches read a line at a time (long) and blocks
    # the fast parse refuses halved down to one line (small).
    data = text.encode("utf-8")
    want = per_line(data, cap, limit)
    got = blocks(data, read, limit, cap=cap, long=long, small=small)
    if isinstance(want, str):
        assert got == want
    else:
        assert isinstance(got, np.ndarray), got
        assert got.dtype == np.int64 and got.tolist() == want.tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=300) | _TEXTS.map(lambda t: t.encode("utf-8") + b"\xff" + b"1\n" * 9),
    st.integers(1, 64),
)
def test_the_block_reader_meets_bytes_that_are_not_text_as_the_per_line_reader_did(data, read):
    # The per-line reader decoded 8 KiB ahead of the line it parsed, so which problem
    # it named first depended on where its 8 KiB fell; the block reader names the
    # first in the file. Either way: one line, the same counts when there is none.
    want = per_line(data, lengthsfile.LINE_CHARS, None)
    got = blocks(data, read, None)
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.tolist() == want.tolist()
    else:
        assert isinstance(got, str) and got.startswith("--lengths x: ") and "\n" not in got
