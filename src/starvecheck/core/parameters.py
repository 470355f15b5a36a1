"""A stage's parameters: what it measured with, as the JSON writes them, typed where
another layer reads them.

`StageResult.parameters` keeps every key a stage wrote (a read-only mapping, so the
JSON is the stage's own dict and a stored report loads back as it was written), and
gives each key that judging or showing reads a typed accessor, declared once below
with the type it is read as and what it is when absent, as metrics got labels
(hyperfine's `BenchmarkResult` carries its parameters the same way). A value of the
wrong type (a stored report edited by hand) reads as absent: judging a stored report
never raises.

advice/ and render/ read parameters through these accessors only
(tests/test_contract.py): a key is named in one place, here, and in the stage that
writes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class _Key(Generic[T]):
    """A typed accessor: `convert(value)` where the key holds one, else `absent`."""

    def __init__(self, convert: Callable[[Any], T], absent: T, key: str | None = None) -> None:
        self.convert, self.absent, self.key = convert, absent, key

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = self.key or name

    @overload
    def __get__(self, obj: None, owner: type) -> _Key[T]: ...
    @overload
    def __get__(self, obj: Parameters, owner: type) -> T: ...
    def __get__(self, obj: Parameters | None, owner: type) -> T | _Key[T]:
        if obj is None:
            return self
        value = obj.get(self.key or "")
        if value is None:
            return self.absent
        try:
            return self.convert(value)
        except (TypeError, ValueError):
            return self.absent


def _number(value: Any) -> float:
    """A number as stored (an int stays an int, so it prints as one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(value)
    return value


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(value)
    return int(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(value)
    return value


def _items(value: Any) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise TypeError(value)
    return tuple(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(value)
    return value


def _cpus(value: Any) -> int:
    """The effective CPUs as a count: the whole part, at least 1."""
    return max(1, int(_number(value)))


def number(key: str | None = None) -> _Key[float | None]:
    return _Key(_number, None, key)


def whole(key: str | None = None, absent: int | None = None) -> _Key[int | None]:
    return _Key(_whole, absent, key)


def text(key: str | None = None) -> _Key[str | None]:
    return _Key(_text, None, key)


def flag(key: str | None = None) -> _Key[bool]:
    return _Key(bool, False, key)


def items(key: str | None = None) -> _Key[tuple[Any, ...]]:
    return _Key(_items, (), key)


def mapping(key: str | None = None) -> _Key[Mapping[str, Any]]:
    return _Key(_mapping, {}, key)


class Parameters(Mapping[str, Any]):
    """A stage's parameters: a read-only mapping of what it wrote, with an accessor
    for each key another layer reads."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Parameters({self._values!r})"

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Parameters:
        """`values` as Parameters (itself where it is one already)."""
        return values if isinstance(values, Parameters) else cls(values)

    # Every stage that sweeps num_workers, and watch: the CPUs DataLoader workers get
    # (affinity and quota) as recorded, a fraction where ranks share a host (watch);
    # `cpus` the same as a whole count, at least 1 (1 where none was recorded).
    effective_cpus = number()
    cpus = _Key(_cpus, 1, "effective_cpus")
    # The batch and the step judged against (loader, starve, factory, pad, doctor).
    batch_size = whole()
    step_ms = number()
    sample_ms = number()  # starve: the CPU time per sample it was given (D)
    sample_cpu_ms = number()  # starve: ... as measured
    capacity_workers = whole()  # starve: the worker count its capacity is at
    assumed = items()  # starve: which of its inputs were assumed, not given
    cuda = flag()  # starve, pcie: a CUDA device was present
    device = text()  # profile: the device the loop trained on
    sample_size_bytes = whole(absent=0)  # loader
    prefetch_factor = whole()  # loader: batches each worker loads ahead
    first_batch_cache = mapping()  # loader: the cache state each first batch met
    # io
    existing = flag()  # the user's own files (--existing), not generated ones
    threads = _Key(lambda v: _items(v) or (1,), (1,))  # the reader counts measured
    median_file_bytes = number()
    small_files_seen = whole(absent=0)  # --existing: files of at most 8 MiB among them
    # loader --factory: the spec, the configurations read, what the workers must fit in
    factory = text()
    dataset = text()  # what FUNC returned, described
    samples_in_dataset = whole()  # its len(), where it has one
    iterable = flag()  # an IterableDataset (workers run its __iter__), not map-style
    read_as_is = flag()  # FUNC returned an iterable holding no DataLoader: one configuration
    configurations = items()
    torch_threads = whole()  # torch's intra-op threads in the measuring process
    rounds = whole()  # each configuration read this many times, in interleaved rounds
    memory_limit_bytes = whole()
    shm_free_bytes = whole()
    shards = whole()  # the dataset's own count of shards (num_shards, n_shards), if it has one
    start_method = text()  # how workers start (fork, spawn, forkserver)
    idle_worker_uss_bytes = whole()  # a worker that has read nothing: its private memory
    # watch: the loop's sampler, and what its first samples of each pass say
    sampler = text()  # the DataLoader's sampler class
    sampler_shuffle = flag()
    sampler_epochs = items()  # a DistributedSampler's epoch as each of the last passes began
    same_order_passes = flag()  # the last two passes began in the same order
    ranks_same_share = number()  # of the first samples, the share every rank had
    ranks_samples_compared = whole()
    world_size = whole()
    # pad
    current = text()  # the strategy trained with today
    context = whole(absent=0)
    lengths_source = text("source")  # where the lengths came from ("default": embedded)
    # pcie
    reference_size = text()
    host_headroom_bytes = whole()
    host_headroom_source = text()  # what the headroom was read from
    pinned_budget_bytes = whole()
    link_samples = whole()  # NVML samples of the link under load
    memlock_unlimited = flag()
    memlock_bytes = whole()
    sizes_skipped = mapping()
    numa_nodes = whole()
    numa_local_node = whole()
    numa_remote_node = whole()
    # a step breakdown: profile --trace and watch
    dataloader = text()  # how batches were fetched (watch: the iterator's class)
    num_workers = whole()  # watch: the DataLoader's own
    data_wait_source = text()  # what the trace marks a fetch with
    gpu_devices = whole(absent=0)
    gpu_device = text()  # the headline GPU where a rank drives several
    runs = items()  # profile --trace: the runs in the files, the one analysed first
    # several ranks: profile --trace of a multi-rank job, watch under torch.distributed
    ranks = items()  # one entry per rank
    headline_rank = text()  # the rank whose steps the breakdown shows
    ranks_on_host = whole()  # watch: ranks sharing this host's CPUs
    machine_cpus = number()  # watch: the machine's online CPUs (the worker model's bound)
    load_average = number()  # watch: its 1-minute load average
    rank_wait_source = text()  # watch: how the wait for the others was had
    straggler = mapping()  # judging's straggler verdict (advice/stragglers.summary)
    # attach: the seconds sampled; each process's `other` frames (pid -> words)
    seconds = number()
    other_frames = mapping()
    gpus = items()  # the job's GPUs: index, name, the job's and others' PIDs on each
    gpu_read = text()  # how the job's GPUs were told, or why none were read

    @property
    def slowest_in(self) -> Mapping[str, int]:
        """Judging's count, per rank, of the common steps it had the most work in."""
        counts = self.straggler.get("slowest_in")
        return counts if isinstance(counts, Mapping) else {}

    @property
    def steps_compared(self) -> int:
        """How many steps every rank has, compared for the straggler verdict."""
        n = self.straggler.get("steps_compared")
        return n if isinstance(n, int) and not isinstance(n, bool) else 0
