"""A real image pipeline to measure with `starvecheck loader --factory`: JPEG files in an
ImageFolder layout, decoded with Pillow, randomly cropped and flipped, made into float
tensors and normalised, as torchvision's ImageNet recipe does.

    starvecheck loader --factory examples/jpeg_pipeline.py:imagefolder --quick
    starvecheck loader --factory examples/jpeg_pipeline.py:imagefolder_uint8 --quick
    starvecheck loader --factory examples/jpeg_pipeline.py:read_only --quick
    python examples/jpeg_pipeline.py [--images N]     # make the images, print where

The images are generated on first use (smooth gradients, shapes and grain, so that they
compress like photographs, about 25 KB each at 320x256) in a directory of their own
under the temporary directory, or under $STARVECHECK_EXAMPLE_DIR; a later run reuses
them. Nothing else is written.

Factories (each returns the DataLoader a training script would build, num_workers=0):
  imagefolder        decode, RandomResizedCrop(224), flip, to float, normalise: batches
                     of 32 x 3 x 224 x 224 float32 (19 MB each)
  imagefolder_uint8  the same decode and augmentation, batches left as uint8 (4.8 MB):
                     conversion and normalisation belong on the GPU
  read_only          the same files read whole, not decoded: what storage alone costs,
                     so that decode is seen apart from reading
  mds                the same images as MosaicML Streaming MDS shards (written on first
                     use next to them), decoded the same way
"""

from __future__ import annotations

import argparse
import io
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

IMAGES = int(os.environ.get("STARVECHECK_EXAMPLE_IMAGES", "1024"))
CLASSES = 8
SIZE = (320, 256)  # width, height
BATCH = 32
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def image_dir(n: int = IMAGES) -> Path:
    base = os.environ.get("STARVECHECK_EXAMPLE_DIR") or tempfile.gettempdir()
    return Path(base) / f"starvecheck-example-jpeg-{n}"


def _picture(rng: np.random.Generator) -> Image.Image:
    w, h = SIZE
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    a, b, c = rng.uniform(0, 1, 3), rng.uniform(0, 1, 3), rng.uniform(0.002, 0.02, 2)
    img = np.empty((h, w, 3), np.float32)
    for ch in range(3):
        img[..., ch] = 255 * (a[ch] * x / w + b[ch] * y / h) / 2
        img[..., ch] += 60 * np.sin(x * c[0] + y * c[1] + ch)
    for _ in range(6):  # a few shapes
        cx, cy, r = rng.integers(0, w), rng.integers(0, h), rng.integers(10, 70)
        inside = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        img[inside] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)  # grain
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def make_images(n: int = IMAGES) -> Path:
    """n JPEGs in root/class_k/, made once (a file marks the set complete)."""
    root = image_dir(n)
    done = root / ".complete"
    if done.is_file():
        return root
    rng = np.random.default_rng(0)
    for i in range(n):
        folder = root / f"class_{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        _picture(rng).save(folder / f"img_{i:06d}.jpg", "JPEG", quality=90)
    done.write_text(f"{n}\n")
    return root


def _files(root: Path) -> list[tuple[str, int]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(str(f), k) for k, c in enumerate(classes) for f in sorted((root / c).glob("*.jpg"))]


def random_resized_crop(img: Image.Image, size: int = 224) -> Image.Image:
    """torchvision's RandomResizedCrop: a random area (8%-100%) and aspect ratio
    (3/4-4/3) of the image, resized to size x size (bilinear)."""
    w, h = img.size
    for _ in range(10):
        area = w * h * random.uniform(0.08, 1.0)
        ratio = np.exp(random.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = round((area * ratio) ** 0.5), round((area / ratio) ** 0.5)
        if 0 < cw <= w and 0 < ch <= h:
            left, top = random.randint(0, w - cw), random.randint(0, h - ch)
            return img.resize((size, size), Image.BILINEAR, box=(left, top, left + cw, top + ch))
    return img.resize((size, size), Image.BILINEAR)


def augment(data: bytes | str, as_float: bool) -> torch.Tensor:
    """Decode, crop, flip; float and normalised, or uint8 as decoded."""
    img = Image.open(data if isinstance(data, str) else io.BytesIO(data))
    img = random_resized_crop(img.convert("RGB"))
    if random.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)  # 3 x 224 x 224 uint8
    if as_float:
        x = (x.float().div_(255) - MEAN) / STD
    return x


class JpegFolder(Dataset):
    """ImageFolder: one JPEG per sample, its class from its folder."""

    def __init__(self, root: Path, as_float: bool = True, decode: bool = True) -> None:
        self.samples = _files(root)
        self.as_float = as_float
        self.decode = decode

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        if not self.decode:
            with open(path, "rb") as f:
                return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8), label
        return augment(path, self.as_float), label


def _collate_bytes(
    batch: list[tuple[torch.Tensor, int]],
) -> tuple[list[torch.Tensor], torch.Tensor]:
    return [x for x, _ in batch], torch.tensor([y for _, y in batch])


def imagefolder() -> DataLoader:
    return DataLoader(JpegFolder(make_images()), batch_size=BATCH, shuffle=True, num_workers=0)


def imagefolder_uint8() -> DataLoader:
    dataset = JpegFolder(make_images(), as_float=False)
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=0)


def read_only() -> DataLoader:
    dataset = JpegFolder(make_images(), decode=False)
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=_collate_bytes)


def mds() -> DataLoader:
    """The same images as MDS shards, read by StreamingDataset and decoded alike."""
    from streaming import MDSWriter, StreamingDataset

    root = make_images()
    shards = root.parent / f"{root.name}-mds"
    if not (shards / "index.json").is_file():
        with MDSWriter(out=str(shards), columns={"jpeg": "bytes", "label": "int"}) as out:
            for path, label in _files(root):
                out.write({"jpeg": Path(path).read_bytes(), "label": label})

    class Decoded(StreamingDataset):
        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:  # type: ignore[override]
            sample = super().__getitem__(i)
            return augment(sample["jpeg"], True), int(sample["label"])

    dataset = Decoded(local=str(shards), shuffle=True, batch_size=BATCH)
    return DataLoader(dataset, batch_size=BATCH, num_workers=0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=IMAGES)
    a = p.parse_args()
    print(make_images(a.images))


if __name__ == "__main__":
    main()
