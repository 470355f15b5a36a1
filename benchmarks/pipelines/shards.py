"""WebDataset tar shards of JPEGs decoded with PIL, resized and cropped to 224, as
WebDataset's documentation builds them, in two shapes a user writes:

  dataloader   the WebDataset batched in the dataset, read by a plain DataLoader with
               batch_size=None (WebDataset's recommended use with torch)
  webloader    the same dataset through wds.WebLoader (a DataPipeline that wraps a
               DataLoader), unbatched, shuffled across workers and batched again

    starvecheck loader --factory benchmarks/pipelines/shards.py:dataloader --quick
    starvecheck loader --factory benchmarks/pipelines/shards.py:webloader --quick
"""

from __future__ import annotations

from pipedata import ensure
from torch.utils.data import DataLoader

BATCH = 32


def _dataset():
    import webdataset as wds
    from torchvision import transforms

    preprocess = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    urls = sorted(str(p) for p in ensure("shards").glob("shard-*.tar"))
    return (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node)
        .shuffle(256)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(preprocess, int)
    )


def dataloader() -> DataLoader:
    return DataLoader(_dataset().batched(BATCH), batch_size=None, num_workers=0)


def webloader():
    import webdataset as wds

    loader = wds.WebLoader(_dataset().batched(BATCH), batch_size=None, num_workers=0)
    return loader.unbatched().shuffle(256).batched(BATCH)
