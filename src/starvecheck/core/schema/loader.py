"""loader's and starve's parameters: a num_workers sweep of generated data (loader)
or of a simulated sample cost (starve)."""

from __future__ import annotations

from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import flag, items, mapping, number, whole


class Parameters(Base):
    """loader's."""

    sample_size_bytes = whole(absent=0)
    prefetch_factor = whole()  # batches each worker loads ahead
    first_batch_cache = mapping()  # the cache state each first batch met


class StarveParameters(Base):
    """starve's."""

    sample_ms = number()  # the CPU time per sample it was given (D)
    sample_cpu_ms = number()  # ... as measured
    capacity_workers = whole()  # the worker count its capacity is at
    assumed = items()  # which of its inputs were assumed, not given
    cuda = flag()  # a CUDA device was present
