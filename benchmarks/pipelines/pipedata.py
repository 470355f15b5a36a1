"""The data behind benchmarks/pipelines/: made once, on first use, in a directory of its
own (`$STARVECHECK_PIPELINE_DATA`, else `<tmp>/starvecheck-pipelines`), reused after.

    python benchmarks/pipelines/pipedata.py        # make it (about 40 s here), print where

  images/       an ImageFolder: 4 classes x 250 JPEGs of 500x375 (ImageNet's typical
                size), smooth gradients, shapes and grain, so they compress like
                photographs (about 40 KB each)
  shards/       the same kind of images as WebDataset tar shards (4 x 250 samples:
                NNNNNN.jpg and NNNNNN.cls), as `tar` writes them
  text/         train.jsonl: 20,000 documents of 40 to 600 words drawn from a Zipf
                vocabulary; tokenizer/: a byte-level BPE (8,000 tokens) trained here on
                them with the tokenizers library, saved for PreTrainedTokenizerFast
  audio/        400 clips of 8 s of 16 kHz mono float32 (.npy): tones, chirps and noise

Nothing is downloaded; everything is generated from fixed seeds, so two machines make
the same files.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import numpy as np

IMAGE_CLASSES, IMAGES_PER_CLASS = 4, 250
IMAGE_SIZE = (500, 375)
SHARDS, PER_SHARD = 4, 250
DOCUMENTS = 20_000
CLIPS, CLIP_S, RATE = 400, 8.0, 16_000


def root() -> Path:
    base = os.environ.get("STARVECHECK_PIPELINE_DATA")
    return Path(base) if base else Path(tempfile.gettempdir()) / "starvecheck-pipelines"


def _picture(rng: np.random.Generator) -> bytes:
    from PIL import Image

    w, h = IMAGE_SIZE
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    a, b, c = rng.uniform(0, 1, 3), rng.uniform(0, 1, 3), rng.uniform(0.002, 0.03, 2)
    img = np.empty((h, w, 3), np.float32)
    for ch in range(3):
        img[..., ch] = 255 * (a[ch] * x / w + b[ch] * y / h) / 2
        img[..., ch] += 50 * np.sin(x * c[0] + y * c[1] + 2 * ch)
    for _ in range(6):  # a few discs
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(10, 90)
        inside = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        img[inside] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=88)
    return out.getvalue()


def _images(where: Path) -> None:
    rng = np.random.default_rng(1)
    for c in range(IMAGE_CLASSES):
        d = where / f"class{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(IMAGES_PER_CLASS):
            (d / f"{i:04d}.jpg").write_bytes(_picture(rng))


def _shards(where: Path) -> None:
    rng = np.random.default_rng(2)
    where.mkdir(parents=True, exist_ok=True)
    for s in range(SHARDS):
        with tarfile.open(where / f"shard-{s:04d}.tar", "w") as tar:
            for i in range(PER_SHARD):
                key = f"{s * PER_SHARD + i:06d}"
                for ext, data in (
                    ("jpg", _picture(rng)),
                    ("cls", str(int(rng.integers(0, 10))).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _text(where: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = np.random.default_rng(3)
    where.mkdir(parents=True, exist_ok=True)
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"]
    vocab = ["".join(rng.choice(syllables, int(rng.integers(1, 4)))) for _ in range(5000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    path = where / "train.jsonl"
    with path.open("w") as f:
        for i in range(DOCUMENTS):
            n = int(rng.integers(40, 600))
            words = rng.choice(vocab, n, p=weights)
            f.write(json.dumps({"id": i, "text": " ".join(words) + "."}) + "\n")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=["[PAD]", "[UNK]"])

    def lines():
        with path.open() as f:
            for line in f:
                yield json.loads(line)["text"]

    tok.train_from_iterator(lines(), trainer)
    (where / "tokenizer").mkdir(exist_ok=True)
    tok.save(str(where / "tokenizer" / "tokenizer.json"))


def _audio(where: Path) -> None:
    rng = np.random.default_rng(4)
    where.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(CLIP_S * RATE), dtype=np.float32) / RATE
    for i in range(CLIPS):
        f0, f1 = rng.uniform(80, 2000, 2)
        clip = 0.3 * np.sin(2 * np.pi * (f0 + (f1 - f0) * t / CLIP_S / 2) * t)
        clip += 0.1 * np.sin(2 * np.pi * rng.uniform(100, 4000) * t)
        clip += rng.normal(0, 0.05, t.shape)
        np.save(where / f"{i:05d}.npy", clip.astype(np.float32))


PARTS = {"images": _images, "shards": _shards, "text": _text, "audio": _audio}


def ensure(part: str) -> Path:
    """The part's directory, made on first use (a `.done` file marks it whole)."""
    where = root() / part
    if not (where / ".done").exists():
        PARTS[part](where)
        (where / ".done").write_text("")
    return where


if __name__ == "__main__":
    for name in PARTS:
        print(ensure(name))
