"""torchvision's ImageFolder as the PyTorch ImageNet example trains on it:
RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize; batches of 32, a
shuffling DataLoader, num_workers=0 (where a script starts).

    starvecheck loader --factory benchmarks/pipelines/vision.py:imagefolder --quick
"""

from __future__ import annotations

from pipedata import ensure
from torch.utils.data import DataLoader

BATCH = 32


def imagefolder() -> DataLoader:
    from torchvision import datasets, transforms

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    dataset = datasets.ImageFolder(
        str(ensure("images")),
        transforms.Compose(
            [
                transforms.RandomResizedCrop(224),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=0)
