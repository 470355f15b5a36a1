"""Where `loader`'s samples come from: the same samples written in three layouts in a
scratch directory (one file each, one shard with an index, MosaicML Streaming MDS
shards), or a sample of the user's own files read-only (--existing). Each layout is
a `Source`: its files, for eviction and residency, and how to open it as a dataset.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starvecheck.core import clocks
from starvecheck.core.metric import Caveat
from starvecheck.core.status import UsageError
from starvecheck.scratch.directory import Scratch, write_all
from starvecheck.stages.samples.datasets import (
    SHARD_INDEX,
    FileSamples,
    ShardSamples,
    TextSamples,
    collate_flat,
    stack_tokens,
)
from starvecheck.stages.samples.layouts import BLOCK, Layout, Progress
from starvecheck.stages.samples.plan import Plan

MDS_OVERHEAD = 64  # bytes per sample an MDS shard adds (offsets, column sizes), rounded up


def _no_progress(what: str, done: int, total: int) -> None:
    pass


def space_needed(samples: int, sample_size: int) -> int:
    """Bytes the three layouts take: each small file in whole blocks, the shard and
    its index, the MDS shards."""
    per_file = -(-sample_size // BLOCK) * BLOCK
    shard = samples * sample_size + SHARD_INDEX.size * (samples + 1)
    mds = samples * (sample_size + MDS_OVERHEAD) + (1 << 20)
    return samples * per_file + shard + mds + BLOCK * (samples // 64 + 8)


class Slowed:
    """A map-style dataset whose every sample takes `delay_ms` longer (a sleep in the
    worker): the testing hook behind STARVECHECK_SLOW_RANKS. Module level, so DataLoader
    workers can receive it."""

    def __init__(self, inner: Any, delay_ms: float) -> None:
        self.inner = inner
        self.delay_ms = delay_ms

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        clocks.sleep(self.delay_ms / 1000)
        return self.inner[i]

    def close(self) -> None:
        self.inner.close()


@dataclass
class Source:
    """One layout: its files (for eviction and residency) and how to open it as a dataset."""

    layout: Layout  # io's description of files on disk; no read patterns here
    make: Callable[[int], Any]  # run number -> a fresh dataset
    release: Callable[[Any], None] = lambda dataset: None
    shuffle: bool = True  # DataLoader(shuffle=): map-style; StreamingDataset shuffles itself
    collate: Callable[[list[Any]], Any] | None = None

    @property
    def name(self) -> str:
        return self.layout.name


def generate(
    scratch: Scratch,
    plan: Plan,
    streaming: Any | None,
    progress: Progress = _no_progress,
) -> list[Source]:
    """Write every sample as its own file, into one shard with an index, and (where
    mosaicml-streaming is installed) into MDS shards; return the layouts."""
    names = _write(scratch, plan, streaming, progress)
    size = plan.sample_size
    total = plan.samples * size
    root_fd, samples_fd = scratch.dir_fd(), scratch.dir_fd("samples")
    sources = [
        Source(
            Layout("small_files", {}, names, samples_fd, total, size, sync=True),
            lambda run: FileSamples(names, samples_fd),
        ),
        Source(
            Layout("shard", {}, ["shard.bin", "shard.idx"], root_fd, total, size, sync=True),
            lambda run: ShardSamples("shard.bin", root_fd, "shard.idx"),
            release=lambda dataset: dataset.close(),
        ),
    ]
    sources = [s for s in sources if plan.wants(s.name)]
    if plan.sample_delay_ms:
        for source in sources:
            source.make = _slowed(source.make, plan.sample_delay_ms)
    if streaming is not None:
        from starvecheck.stages.samples import mds

        scratch.adopt("mds")
        mds_dir = os.path.join(scratch.path, "mds")
        mds_fd = scratch.dir_fd("mds")
        files = sorted(os.listdir(mds_fd))

        def make_mds(run: int) -> Any:
            dataset = streaming.StreamingDataset(
                local=mds_dir,
                shuffle=True,
                batch_size=plan.batch_size,
                shuffle_seed=plan.seed + run,
            )
            scratch.note(mds.marker_line(dataset, streaming))  # for `starvecheck clean`
            return dataset

        sources.append(
            Source(
                Layout("mds", {}, files, mds_fd, total, size, sync=True),
                make_mds,
                release=lambda dataset: mds.release(dataset, streaming),
                shuffle=False,
            )
        )
    return sources


def _write(scratch: Scratch, plan: Plan, streaming: Any | None, progress: Progress) -> list[str]:
    """The samples, random bytes, each written three ways: its own file in samples/,
    appended to shard.bin (offsets in shard.idx), and with `streaming` to MDS shards
    in mds/; synced. The small files' names, in order."""
    import numpy as np

    size = plan.sample_size
    scratch.mkdir("samples")
    names = [f"{i:07d}.bin" for i in range(plan.samples)]
    offsets = [i * size for i in range(plan.samples + 1)]
    writer = None
    if streaming is not None:
        scratch.mkdir("mds")
        # The writer opens its own files in mds/: Scratch.adopt records them in
        # generate(), and again in the stage's `finally` should writing be interrupted.
        writer = streaming.MDSWriter(
            out=os.path.join(scratch.path, "mds"), columns={"data": f"ndarray:uint8:{size}"}
        )
    shard_fd = scratch.new_file("shard.bin")
    try:
        for i, name in enumerate(names):
            data = os.urandom(size)  # incompressible: no fs compression tricks
            scratch.write_file(name, data, "samples")
            write_all(shard_fd, data)
            if writer is not None:
                writer.write({"data": np.frombuffer(data, np.uint8)})
            if i % 256 == 0:
                progress("writing samples", i, plan.samples)
        if writer is not None:
            writer.finish()
    finally:
        os.close(shard_fd)
    scratch.write_file("shard.idx", b"".join(SHARD_INDEX.pack(o) for o in offsets))
    progress("writing samples", plan.samples, plan.samples)
    scratch.syncfs()
    return names


def _slowed(make: Callable[[int], Any], delay_ms: float) -> Callable[[int], Any]:
    return lambda run: Slowed(make(run), delay_ms)


def existing_sources(path: str, plan: Plan) -> tuple[list[Source], dict[str, Any], list[Caveat]]:
    """A uniform sample of the user's files up to 8 MiB, read whole, read-only."""
    from starvecheck.stages.samples import existing

    rng = random.Random(plan.seed)
    found = existing.discover(path, plan.samples, rng)
    flags = existing.read_flags(found.owners)
    paths, bad = existing.readable([p for p, _ in found.small], flags)
    if not paths:
        raise UsageError(
            f"{path}: no readable, non-empty regular files of at most 8 MiB to sample "
            "(loader reads whole files as samples; for shards use `starvecheck io --existing`)"
        )
    sizes = dict(found.small)
    total = sum(sizes[p] for p in paths)
    by_size = sorted(sizes[p] for p in paths)
    source = Source(
        Layout("files", {}, paths, None, total, 1 << 20, sync=False, evict_flags=flags),
        lambda run: FileSamples(paths, None, flags),
        collate=collate_flat,
    )
    params = {
        "existing": True,
        "files_seen": found.small_seen + found.large_seen,
        "files_read": len(paths),
        "median_file_bytes": by_size[len(by_size) // 2],
        "large_files_skipped": found.large_seen,
    }
    caveats = []
    if found.large_seen:
        caveats.append(
            Caveat(
                "loader.large-files-skipped",
                f"{found.large_seen:,} files over 8 MiB (shards, archives) were not read: "
                "loader reads whole files as samples; `starvecheck io --existing` reads ranges "
                "of them",
            )
        )
    if found.truncated:
        caveats.append(
            Caveat(
                "loader.listing-truncated",
                f"listing stopped after {existing.SCAN_LIMIT:,} files; the sample is drawn "
                "from those",
            )
        )
    if found.symlinks:
        caveats.append(
            Caveat(
                "loader.symlinks-skipped",
                f"{found.symlinks:,} symlinks not followed (the sample stays inside PATH)",
            )
        )
    if found.unreadable + bad:
        caveats.append(
            Caveat(
                "loader.unreadable-skipped",
                f"{found.unreadable + bad:,} files or directories could not be read and were "
                "skipped",
            )
        )
    if not flags & os.O_NOATIME:
        caveats.append(
            Caveat(
                "loader.atime",
                "files owned by other users were read without O_NOATIME: their access times "
                "may change (contents and modification times do not)",
            )
        )
    caveats.append(
        Caveat(
            "loader.raw-bytes",
            "the files are read as raw bytes, each batch collated into one flat tensor (they "
            "differ in size): decoding (JPEG, tokenizing) costs CPU on top, which "
            "`starvecheck starve` measures",
        )
    )
    return [source], params, caveats


def text_source(
    scratch: Scratch, texts: list[str], tokenizer: Any, seq_len: int, vocab: int
) -> Source:
    """Raw UTF-8 text, one sample per text, in one shard with an index (as the shard
    layout stores bytes), read back and tokenized per sample: `profile`'s text layout."""
    encoded = [t.encode("utf-8") for t in texts]
    offsets = [0]
    for data in encoded:
        offsets.append(offsets[-1] + len(data))
    scratch.write_file("text.bin", b"".join(encoded))
    scratch.write_file("text.idx", b"".join(SHARD_INDEX.pack(o) for o in offsets))
    scratch.syncfs()
    root_fd = scratch.dir_fd()
    mean = offsets[-1] // max(1, len(texts))
    return Source(
        Layout("text", {}, ["text.bin", "text.idx"], root_fd, offsets[-1], mean, sync=True),
        lambda run: TextSamples(
            ShardSamples("text.bin", root_fd, "text.idx"), tokenizer, seq_len, vocab
        ),
        release=lambda dataset: dataset.close(),
        collate=stack_tokens,
    )
