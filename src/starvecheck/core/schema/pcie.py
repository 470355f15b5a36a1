"""pcie's parameters."""

from __future__ import annotations

from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import flag, mapping, text, whole


class Parameters(Base):
    cuda = flag()  # a CUDA device was present
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
