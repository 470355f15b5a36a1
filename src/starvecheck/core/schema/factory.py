"""loader --factory's words: the layout its figures carry, the roles a configuration
plays, the processes its costs are counted in, and each configuration read as a
record of its parameters (`configurations`)."""

from __future__ import annotations

from dataclasses import dataclass

from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import flag, items, number, records, text, whole
from starvecheck.core.schema.record import Record

LAYOUT = "own"  # the layout label of the user's own pipeline's figures

# role: what a configuration is read for
ROLE_WORKERS = "workers"  # a num_workers of the sweep
ROLE_CURRENT = "current"  # the pipeline as the user made it
SWEPT = (ROLE_WORKERS, ROLE_CURRENT)  # the roles whose counts make the sweep
ROLE_START = "start"  # the recommended count under the other start method

# process: where a cost was counted
MAIN = "main"  # the training process
WORKER = "worker"  # one DataLoader worker
WORKERS = "workers"  # all of them together


@dataclass(frozen=True)
class Configuration(Record):
    """One configuration as read: its role and worker count, what it read and in how
    long."""

    role: str
    workers: int
    config: str = ""  # described: num_workers=2, pin_memory=True, ...
    stopped: str = ""  # why its reading stopped: stable, budget, epoch
    batches: int = 0
    samples: int = 0
    seconds: float = 0.0
    epochs: int = 0
    partial_window: bool = False  # its only window was cut short


class Parameters(Base):
    factory = text()  # the spec, FILE.py:FUNC
    dataset = text()  # what FUNC returned, described
    samples_in_dataset = whole()  # its len(), where it has one
    iterable = flag()  # an IterableDataset (workers run its __iter__), not map-style
    read_as_is = flag()  # FUNC returned an iterable holding no DataLoader: one configuration
    configurations = records(Configuration)
    torch_threads = whole()  # torch's intra-op threads in the measuring process
    rounds = whole()  # each configuration read this many times, in interleaved rounds
    budget_s = number()  # --budget: seconds a configuration, over its rounds
    memory_limit_bytes = whole()
    shm_free_bytes = whole()
    shards = whole()  # the dataset's own count of shards (num_shards, n_shards), if it has one
    start_method = text()  # how workers start (fork, spawn, forkserver)
    dataset_pickle_bytes = whole()  # the dataset pickled, as a forkserver or spawn worker gets it
    dataset_pickle_s = number()  # ... and the seconds pickling it took here
    dataset_pickle_error = text()  # why it could not be pickled, where it could not
    other_start_method = text()  # the start method the `start` configuration was read under
    idle_worker_uss_bytes = whole()  # a worker that has read nothing: its private memory
    current = text()  # the current configuration, described
    reread = items()
