"""Batching strategies over token lengths: where each sample lands and what it costs.

Pure numpy, no I/O, vectorised so that every strategy on 1,000,000 lengths takes
well under a second (benchmarks/pad_strategies.py). Every strategy returns a
`Layout`: the samples in the order placed, the row each one lands in, and how many
positions each row computes. The figures (`Figures`) follow from it.

Lengths must already be cut to the context (1 <= L <= context); `pad` does that and
reports what the cut cost.

Strategy ids are stable: they name JSON metrics (`efficiency.<id>`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from starvecheck.core.strategies import SHARES_ROWS, STRATEGIES


@dataclass(frozen=True)
class Layout:
    """Where the samples went. `order[i]` is placed in row `row[i]` (non-decreasing);
    row r computes `row_len[r]` positions, its samples' tokens and then padding."""

    strategy: str
    order: np.ndarray
    row: np.ndarray
    row_len: np.ndarray
    rows_per_batch: int
    # True: each batch is one flat sequence (padding-free), so without a per-document
    # mask attention spans the whole batch rather than one row.
    flat_batches: bool = False

    @property
    def rows(self) -> int:
        return int(self.row_len.size)

    @property
    def batches(self) -> int:
        return -(-self.rows // self.rows_per_batch)

    def row_tokens(self, lengths: np.ndarray) -> np.ndarray:
        return np.bincount(self.row, weights=lengths[self.order], minlength=self.rows).astype(
            np.int64
        )

    def batch_positions(self) -> np.ndarray:
        starts = np.arange(0, self.rows, self.rows_per_batch)
        return np.add.reduceat(self.row_len, starts) if self.rows else np.zeros(0, np.int64)


@dataclass(frozen=True)
class Figures:
    """What a layout costs, for the whole epoch."""

    tokens: int
    positions: int
    batches: int
    max_batch_positions: int
    attention: float  # sum of squared attended lengths, per-document where rows are shared
    attention_unmasked: float | None  # rows shared with no per-document mask

    @property
    def efficiency(self) -> float:
        return self.tokens / self.positions if self.positions else 1.0

    @property
    def padding(self) -> int:
        return self.positions - self.tokens

    @property
    def positions_per_batch(self) -> float:
        return self.positions / self.batches if self.batches else 0.0


def figures(layout: Layout, lengths: np.ndarray) -> Figures:
    lengths = np.asarray(lengths, dtype=np.int64)
    squares = lengths.astype(np.float64) ** 2
    if layout.strategy in SHARES_ROWS:
        attention = float(squares.sum())  # FlashAttention varlen / position_ids: per document
        if layout.flat_batches:
            per_batch = layout.batch_positions().astype(np.float64)
            unmasked = float((per_batch**2).sum())
        else:
            unmasked = float((layout.row_len.astype(np.float64) ** 2).sum())
    else:
        # A padded row is computed whole: the mask hides padding, it does not skip it.
        attention = float((layout.row_len.astype(np.float64) ** 2).sum())
        unmasked = None
    per_batch = layout.batch_positions()
    return Figures(
        tokens=int(lengths.sum()),
        positions=int(layout.row_len.sum()),
        batches=layout.batches,
        max_batch_positions=int(per_batch.max()) if per_batch.size else 0,
        attention=attention,
        attention_unmasked=unmasked,
    )


def _check(lengths: np.ndarray, context: int, batch_size: int) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError("lengths must be one-dimensional")
    if context < 1 or batch_size < 1:
        raise ValueError("context and batch size must be positive")
    if lengths.size and (lengths.min() < 1 or lengths.max() > context):
        raise ValueError(f"lengths must lie in 1..{context} (cut them to the context first)")
    return lengths


def _padded_rows(
    strategy: str, lengths: np.ndarray, order: np.ndarray, batch_size: int, multiple: int = 1
) -> Layout:
    """One sample per row, each batch of `batch_size` consecutive samples of `order`
    padded to its longest (rounded up to `multiple`)."""
    n = order.size
    if n == 0:
        return Layout(strategy, order, order.copy(), np.zeros(0, np.int64), batch_size)
    starts = np.arange(0, n, batch_size)
    longest = np.maximum.reduceat(lengths[order], starts)
    if multiple > 1:
        longest = -(-longest // multiple) * multiple
    counts = np.diff(np.append(starts, n))
    return Layout(strategy, order, np.arange(n), np.repeat(longest, counts), batch_size)


def pad_to_context(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    lengths = _check(lengths, context, batch_size)
    n = lengths.size
    return Layout(
        "pad_to_context", np.arange(n), np.arange(n), np.full(n, context, np.int64), batch_size
    )


def _shuffled(n: int, seed: int) -> np.ndarray:
    """The order a shuffling sampler draws: the same for every strategy of one run.
    RandomState, whose stream numpy keeps the same across versions: a seed gives the
    same figures on every machine."""
    return np.random.RandomState(seed).permutation(n)


def dynamic(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    """DataCollatorWithPadding: random batches, each padded to its longest sample."""
    lengths = _check(lengths, context, batch_size)
    return _padded_rows("dynamic", lengths, _shuffled(lengths.size, seed), batch_size)


def dynamic_mult8(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    lengths = _check(lengths, context, batch_size)
    order = _shuffled(lengths.size, seed)
    return _padded_rows("dynamic_mult8", lengths, order, batch_size, multiple=8)


def dynamic_mult64(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    lengths = _check(lengths, context, batch_size)
    order = _shuffled(lengths.size, seed)
    return _padded_rows("dynamic_mult64", lengths, order, batch_size, multiple=64)


def length_grouped_order(lengths: np.ndarray, batch_size: int, seed: int) -> np.ndarray:
    """transformers' get_length_grouped_indices (group_by_length=True): shuffle, cut
    into mega-batches of min(50, n // 4B) batches, sort each by length descending,
    and swap the longest sample of all to the very front."""
    n = lengths.size
    perm = _shuffled(n, seed)
    if n == 0:
        return perm
    mult = min(n // (batch_size * 4), 50) or 1
    mega = mult * batch_size
    group = np.arange(n) // mega
    order = perm[np.lexsort((-lengths[perm], group))]  # stable within equal lengths
    firsts = np.arange(0, n, mega)
    top = firsts[int(np.argmax(lengths[order[firsts]]))]
    order[[0, top]] = order[[top, 0]]
    return order


def length_grouped(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    lengths = _check(lengths, context, batch_size)
    order = length_grouped_order(lengths, batch_size, seed)
    return _padded_rows("length_grouped", lengths, order, batch_size)


def padding_free(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    """DataCollatorWithFlattening: each batch is one flat sequence, no padding at all;
    rows here are the samples, each computing its own length."""
    lengths = _check(lengths, context, batch_size)
    order = _shuffled(lengths.size, seed)
    n = order.size
    return Layout("padding_free", order, np.arange(n), lengths[order], batch_size, True)


def next_fit_rows(lengths: np.ndarray, context: int) -> np.ndarray:
    """Row of each sample when samples go, in order, into the current row while they
    fit and open a new row when not (next-fit).

    Vectorised by pointer doubling: nxt[i] is where a row starting at sample i ends
    (one searchsorted over the prefix sums); the row starts are 0, nxt[0],
    nxt[nxt[0]], ..., gathered 1, 2, 4, ... at a time with nxt squared each round:
    log2(rows) rounds of O(n) numpy work."""
    n = lengths.size
    if n == 0:
        return np.zeros(0, np.int64)
    prefix = np.concatenate(([0], np.cumsum(lengths)))
    nxt = np.searchsorted(prefix, prefix[:-1] + context, side="right") - 1
    nxt = np.append(nxt, n)  # n is the sink: past the last sample
    starts = np.zeros(1, np.int64)
    jump = nxt
    while True:
        more = jump[starts]
        more = more[more < n]
        if more.size == 0:
            break
        starts = np.concatenate((starts, more))
        jump = jump[jump]
    first = np.zeros(n, np.int64)
    first[np.sort(starts)[1:]] = 1
    return np.cumsum(first)


def greedy_pack(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    """Samples into rows of `context` in arrival order, a new row when the next does not fit."""
    lengths = _check(lengths, context, batch_size)
    row = next_fit_rows(lengths, context)
    rows = int(row[-1]) + 1 if row.size else 0
    return Layout(
        "greedy_pack", np.arange(lengths.size), row, np.full(rows, context, np.int64), batch_size
    )


def fit_decreasing(lengths: np.ndarray, context: int, best: bool) -> tuple[np.ndarray, np.ndarray]:
    """First-fit (or best-fit) decreasing: samples longest first, each into the first
    row (or the fullest row) with room, a new row when none has. Returns (order, row).

    Samples of equal length are placed together: with identical items both rules
    fill one chosen row until the next does not fit before moving on, so a group of
    k samples of length s needs one pass over the open rows (capacity rem // s
    each, filled in row order or tightest first) instead of k, and none when a count
    of rows by room says no open row has s free. Cost: at most O(rows) numpy work
    per distinct length."""
    n = lengths.size
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(-lengths, kind="stable")
    ordered = lengths[order]
    row_of = np.empty(n, np.int64)
    room = np.empty(n, np.int32)  # free positions per open row (int32: half the bytes to scan)
    # Rows per amount of room: a group that fits no open row skips the scan of them all.
    by_room = np.zeros(context + 1, np.int64)
    rows = 0
    starts = np.flatnonzero(np.diff(ordered, prepend=-1))
    ends = np.append(starts[1:], n)
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        size, k, placed = int(ordered[start]), end - start, 0
        if rows and by_room[size:].any():
            open_rows = np.flatnonzero(room[:rows] >= size)
            if open_rows.size:
                if best:
                    open_rows = open_rows[np.argsort(room[open_rows], kind="stable")]
                open_rows = open_rows[:k]  # each takes at least one: k rows are enough
                capacity = np.cumsum(room[open_rows] // size)
                placed = min(k, int(capacity[-1]))
                slot = np.searchsorted(capacity, np.arange(placed), side="right")
                row_of[start : start + placed] = open_rows[slot]
                taken = np.bincount(slot)
                used = open_rows[: taken.size]
                np.subtract.at(by_room, room[used], 1)
                room[used] -= size * taken
                np.add.at(by_room, room[used], 1)
        left = k - placed
        if left:
            per_row = context // size
            new = -(-left // per_row)
            row_of[start + placed : end] = rows + np.arange(left) // per_row
            filled = np.full(new, per_row, np.int64)
            filled[-1] = left - (new - 1) * per_row
            room[rows : rows + new] = context - size * filled
            by_room += np.bincount(room[rows : rows + new], minlength=context + 1)
            rows += new
    # Present rows in order, each with its samples longest first.
    regroup = np.argsort(row_of, kind="stable")
    return order[regroup], row_of[regroup]


def ffd_pack(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    lengths = _check(lengths, context, batch_size)
    order, row = fit_decreasing(lengths, context, best=False)
    rows = int(row[-1]) + 1 if row.size else 0
    return Layout("ffd_pack", order, row, np.full(rows, context, np.int64), batch_size)


def bfd_pack(lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    """TRL's packing_strategy="bfd": best-fit decreasing into rows of `context`."""
    lengths = _check(lengths, context, batch_size)
    order, row = fit_decreasing(lengths, context, best=True)
    rows = int(row[-1]) + 1 if row.size else 0
    return Layout("bfd_pack", order, row, np.full(rows, context, np.int64), batch_size)


BUILD: dict[str, Callable[[np.ndarray, int, int, int], Layout]] = {
    "pad_to_context": pad_to_context,
    "dynamic": dynamic,
    "dynamic_mult8": dynamic_mult8,
    "dynamic_mult64": dynamic_mult64,
    "length_grouped": length_grouped,
    "padding_free": padding_free,
    "greedy_pack": greedy_pack,
    "ffd_pack": ffd_pack,
    "bfd_pack": bfd_pack,
}
assert tuple(BUILD) == STRATEGIES


def layout(strategy: str, lengths: np.ndarray, context: int, batch_size: int, seed: int) -> Layout:
    return BUILD[strategy](lengths, context, batch_size, seed)
