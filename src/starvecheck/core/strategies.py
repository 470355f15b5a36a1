"""The batching strategies `pad` compares, by stable id (JSON metric names use them).

No numpy here: renderers and advice import these names without loading it.
"""

# In the order a person reads them: the worst default first, packing last.
STRATEGIES = (
    "pad_to_context",
    "dynamic",
    "dynamic_mult8",
    "dynamic_mult64",
    "length_grouped",
    "padding_free",
    "greedy_pack",
    "ffd_pack",
    "bfd_pack",
)
# Several samples share a row: without a per-document mask they attend to each other.
SHARES_ROWS = frozenset({"padding_free", "greedy_pack", "ffd_pack", "bfd_pack"})
# Laid out in a random order, so their figures vary with the shuffle.
SHUFFLED = frozenset(
    {"dynamic", "dynamic_mult8", "dynamic_mult64", "length_grouped", "padding_free"}
)
LABELS = {
    "pad_to_context": "pad to context",
    "dynamic": "dynamic padding",
    "dynamic_mult8": "dynamic, multiple of 8",
    "dynamic_mult64": "dynamic, multiple of 64",
    "length_grouped": "length-grouped",
    "padding_free": "padding-free (flattened)",
    "greedy_pack": "greedy packing",
    "ffd_pack": "first-fit-decreasing packing",
    "bfd_pack": "best-fit-decreasing packing",
}
