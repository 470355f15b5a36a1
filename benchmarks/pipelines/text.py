"""JSON Lines documents tokenized in `__getitem__` by a fast byte-level BPE tokenizer
(trained here, loaded with PreTrainedTokenizerFast), truncated to 512 tokens and padded
per batch by transformers' DataCollatorWithPadding; batches of 32, num_workers=0.

    starvecheck loader --factory benchmarks/pipelines/text.py:tokenized --quick
"""

from __future__ import annotations

import json

import numpy as np
from pipedata import ensure
from torch.utils.data import DataLoader, Dataset

BATCH = 32
MAX_LENGTH = 512


def tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(ensure("text") / "tokenizer" / "tokenizer.json"),
        pad_token="[PAD]",
        unk_token="[UNK]",
    )
    return tok


class Documents(Dataset):
    """The file's lines kept as one bytes buffer and offsets (no Python object per
    document), each tokenized when read."""

    def __init__(self, path: str, tok) -> None:
        with open(path, "rb") as f:
            raw = f.read()
        ends = np.flatnonzero(np.frombuffer(raw, np.uint8) == 10)
        self.raw, self.starts, self.ends = raw, np.r_[0, ends[:-1] + 1], ends
        self.tok = tok

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int) -> dict:
        line = self.raw[self.starts[i] : self.ends[i]]
        text = json.loads(line)["text"]
        return self.tok(text, truncation=True, max_length=MAX_LENGTH)


def tokenized() -> DataLoader:
    from transformers import DataCollatorWithPadding

    tok = tokenizer()
    data = Documents(str(ensure("text") / "train.jsonl"), tok)
    return DataLoader(data, batch_size=BATCH, shuffle=True, collate_fn=DataCollatorWithPadding(tok))
