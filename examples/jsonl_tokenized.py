"""A text pipeline to measure with `starvecheck loader --factory`: a JSONL file of
documents, tokenized on the fly by a local tokenizer in `__getitem__`, padded per batch
by the collate function, as a fine-tuning script without a pre-tokenized cache does.

    starvecheck loader --factory examples/jsonl_tokenized.py:jsonl --quick
    starvecheck loader --factory examples/jsonl_tokenized.py:jsonl_in_lists --quick
    python examples/jsonl_tokenized.py        # make the data and tokenizer, print where

The documents (20,000, 40 to 400 words each, about 20 MB) and a byte-level BPE
tokenizer trained on them (8,000 tokens, the `tokenizers` library: nothing is
downloaded) are made on first use in a directory of their own under the temporary
directory, or under $STARVECHECK_EXAMPLE_DIR; a later run reuses them.

Factories (each returns the DataLoader a training script would build, num_workers=0):
  jsonl           the file's line offsets in a numpy array; each sample is read with
                  one pread and tokenized when asked for
  jsonl_in_lists  the same documents held as a Python list of dicts, as
                  `[json.loads(line) for line in f]` leaves them: every worker copies
                  the pages it reads (starvecheck's `loader.copy-on-read`)
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

DOCS = int(os.environ.get("STARVECHECK_EXAMPLE_DOCS", "20000"))
BATCH = 16
CONTEXT = 512
VOCAB = 8000


def data_dir(n: int = DOCS) -> Path:
    base = os.environ.get("STARVECHECK_EXAMPLE_DIR") or tempfile.gettempdir()
    return Path(base) / f"starvecheck-example-jsonl-{n}"


def make_data(n: int = DOCS) -> Path:
    """train.jsonl and tokenizer.json, made once (a file marks the set complete)."""
    root = data_dir(n)
    if (root / ".complete").is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = [
        "".join(rng.choice("etaoinshrdlucmfwypvbgkjqxz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    with open(root / "train.jsonl", "w") as f:
        for i in range(n):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(40, 400)))
            f.write(json.dumps({"id": i, "text": text.capitalize() + "."}) + "\n")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["[PAD]", "[UNK]"])

    def texts():
        with open(root / "train.jsonl") as f:
            for line in f:
                yield json.loads(line)["text"]

    tok.train_from_iterator(texts(), trainer)
    tok.save(str(root / "tokenizer.json"))
    (root / ".complete").write_text(f"{n}\n")
    return root


def _tokenizer(root: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    tok.enable_truncation(CONTEXT)
    return tok


class JsonlDocs(Dataset):
    """One document per line; line offsets in a numpy array (no Python object per
    sample to copy), the file opened once per process, the text tokenized here."""

    def __init__(self, root: Path) -> None:
        self.path = str(root / "train.jsonl")
        self.root = root
        offsets = [0]
        with open(self.path, "rb") as f:
            for line in f:
                offsets.append(offsets[-1] + len(line))
        self.offsets = np.array(offsets, dtype=np.int64)
        self._fd: int | None = None
        self._tok = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._fd is None:  # opened in each worker, after the fork
            self._fd = os.open(self.path, os.O_RDONLY)
            self._tok = _tokenizer(self.root)
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        text = json.loads(os.pread(self._fd, end - start, start))["text"]
        return torch.tensor(self._tok.encode(text).ids, dtype=torch.int64)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_tok": None}


class JsonlInLists(Dataset):
    """The same documents as a list of dicts in memory."""

    def __init__(self, root: Path) -> None:
        with open(root / "train.jsonl") as f:
            self.docs = [json.loads(line) for line in f]
        self.root = root
        self._tok = None

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._tok is None:
            self._tok = _tokenizer(self.root)
        return torch.tensor(self._tok.encode(self.docs[i]["text"]).ids, dtype=torch.int64)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tok": None}


def pad(batch: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pad to the longest in the batch: input_ids and attention_mask."""
    longest = max(len(x) for x in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.int64)
    mask = torch.zeros(len(batch), longest, dtype=torch.int64)
    for row, x in enumerate(batch):
        ids[row, : len(x)] = x
        mask[row, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def jsonl() -> DataLoader:
    return DataLoader(JsonlDocs(make_data()), batch_size=BATCH, shuffle=True, collate_fn=pad)


def jsonl_in_lists() -> DataLoader:
    return DataLoader(JsonlInLists(make_data()), batch_size=BATCH, shuffle=True, collate_fn=pad)


if __name__ == "__main__":
    print(make_data())
