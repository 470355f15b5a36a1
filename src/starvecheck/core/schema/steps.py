"""A step breakdown's words (profile's own loop, profile --trace, watch): the runs a
trace folder holds and the ranks a breakdown compares, as records of its parameters
(`runs`, `ranks`), and its parameters typed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import flag, items, number, records, text, whole
from starvecheck.core.schema.record import Record


@dataclass(frozen=True)
class Run(Record):
    """A run found in a trace folder; the first is the one analysed, each other one
    with its headline figures (or why it could not be analysed)."""

    world_size: int | None = None
    ranks: tuple[int, ...] = ()
    files: int = 0
    headline_rank: str | None = None
    data_wait_share: float | None = None
    step_ms: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Rank(Record):
    """A rank of the breakdown: its name (`rank 3`), for every kind of breakdown; the
    rest of its row is the stage's (a trace's file and devices, watch's steps)."""

    rank: str


@dataclass(frozen=True)
class Straggler(Record):
    """Judging's straggler verdict across ranks (advice/stragglers.summary): `pattern`
    'fixed' (one rank, named, the cause its steps show), 'rotating' (a different rank
    in turn) or 'none'; `slowest_in` how many common steps each rank had the most work
    in, of `steps_compared`."""

    pattern: str = "none"
    rank: str | None = None
    cause: str | None = None
    lost_share: float | None = None
    slowest_in: Mapping[str, int] = field(default_factory=dict)
    steps_compared: int = 0


class Parameters(Base):
    device = text()  # profile: the device the loop trained on
    dataloader = text()  # how batches were fetched (watch: the iterator's class)
    num_workers = whole()  # watch: the DataLoader's own
    data_wait_source = text()  # what the trace marks a fetch with
    gpu_devices = whole(absent=0)
    gpu_device = text()  # the headline GPU where a rank drives several
    runs = records(Run)  # profile --trace: the runs in the files, the one analysed first
    ranks = records(Rank)  # several ranks: one entry per rank
    headline_rank = text()  # the rank whose steps the breakdown shows
    ranks_on_host = whole()  # watch: ranks sharing this host's CPUs
    machine_cpus = number()  # watch: the machine's online CPUs (the worker model's bound)
    load_average = number()  # watch: its 1-minute load average
    rank_wait_source = text()  # watch: how the wait for the others was had
    # watch: the loop's sampler, and what its first samples of each pass say
    sampler = text()  # the DataLoader's sampler class
    sampler_shuffle = flag()
    sampler_epochs = items()  # a DistributedSampler's epoch as each of the last passes began
    same_order_passes = flag()  # the last two passes began in the same order
    ranks_same_share = number()  # of the first samples, the share every rank had
    ranks_samples_compared = whole()
    world_size = whole()
    # watch: how the DataLoader's workers are started and kept (loading/tap.py)
    start_method = text()  # fork, forkserver, spawn
    persistent_workers = flag()
