"""Every finding starvecheck gives, in one catalogue: its id, the severities it is
detected in and what it says. The wording of each finding's title and evidence is
written where it is detected; its id is spelled here alone, as a `Kind` (a str), and
every other module names it through this module. A finding built with a severity above
those its kind lists is refused (core/model.Finding); judging may lower one (a gain
inside the noise, an assumed input). The docs test reads this catalogue: every id must
be documented, and every id here must be given somewhere (tests/test_contract.py).
"""

from __future__ import annotations

from starvecheck.core.model import Severity

CRIT, WARN, INFO, OK = Severity.CRITICAL, Severity.WARNING, Severity.INFO, Severity.OK


class Kind(str):
    """A finding's id (the string people grep and gate on), with the severities it
    comes in and what it says (a title's template, values left out)."""

    severities: frozenset[Severity]
    says: str
    titles: dict[str, str]

    def __new__(
        cls,
        id_: str,
        severities: tuple[Severity, ...],
        says: str,
        titles: dict[str, str] | None = None,
    ) -> Kind:
        kind = super().__new__(cls, id_)
        kind.severities = frozenset(severities)
        kind.says = says
        kind.titles = dict(titles or {})
        return kind

    # str.title is never a Kind's: a Kind's title is one of its forms' wording.
    def title(self, form: str, **values: object) -> str:  # type: ignore[override]
        """The title of one of its forms, its values filled in: a finding that more
        than one rule gives is worded here once, apart from where it is detected."""
        return self.titles[form].format(**values)

    @property
    def stage(self) -> str:
        return self.partition(".")[0]

    def __reduce__(self) -> tuple[object, tuple[str]]:
        # Pickled (a rank's findings gathered over torch.distributed, a copy) as its id,
        # and read back as the catalogue's own kind.
        return (kind, (str(self),))


def kind(id_: str) -> Kind | str:
    """The catalogue's kind of this id; the id itself where it has none (a report of
    another version read back)."""
    return CATALOGUE.get(id_, id_)


# --- env ---------------------------------------------------------------------------------

ENV_CPU = Kind("env.cpu", (OK,), "… effective CPUs, as os.cpu_count() reports")
ENV_CPU_OVERSUBSCRIBED = Kind(
    "env.cpu-oversubscribed", (WARN,), "os.cpu_count() says … CPUs, but this process can use …"
)
ENV_CPU_THROTTLED = Kind(
    "env.cpu-throttled",
    (WARN, INFO),
    "the CPU quota throttled this cgroup in … of scheduler periods",
)
ENV_CPU_THROTTLING = Kind("env.cpu-throttling", (OK,), "no CPU throttling recorded")
ENV_MEMLOCK = Kind("env.memlock", (OK,), "RLIMIT_MEMLOCK is …")
ENV_MEMLOCK_LOW = Kind(
    "env.memlock-low",
    (WARN, INFO),
    "locked memory is limited to … (RLIMIT_MEMLOCK)",
)
ENV_MEMORY_LIMIT = Kind("env.memory-limit", (INFO,), "this cgroup may use … of the machine's …")
ENV_NETWORK_STORAGE = Kind("env.network-storage", (WARN,), "the data path is on …")
ENV_NO_GPU = Kind("env.no-gpu", (INFO,), "no NVIDIA GPU is visible")
ENV_NOFILE = Kind("env.nofile", (OK,), "open files limit is …")
ENV_NOFILE_LOW = Kind("env.nofile-low", (WARN,), "only … open files allowed (RLIMIT_NOFILE)")
ENV_NUMA = Kind("env.numa", (OK,), "every GPU is on a NUMA node this process runs on")
ENV_NUMA_REMOTE_GPU = Kind(
    "env.numa-remote-gpu", (WARN,), "… of … GPUs are on a NUMA node this process cannot run on"
)
ENV_NUMA_UNBOUND = Kind(
    "env.numa-unbound", (INFO,), "this process may run on all … NUMA nodes; its GPUs sit on …"
)
ENV_PCIE_GEN_BELOW_MAX = Kind(
    "env.pcie-gen-below-max", (INFO,), "… GPU link… at a lower PCIe generation now (…)"
)
ENV_PCIE_WIDTH = Kind("env.pcie-width", (OK,), "every GPU's PCIe link runs at its full width (…)")
ENV_PCIE_WIDTH_DEGRADED = Kind(
    "env.pcie-width-degraded", (WARN,), "… GPU link… trained below full width"
)
ENV_PIDS_LOW = Kind("env.pids-low", (WARN,), "the cgroup allows only … tasks (pids.max)")
ENV_ROTATIONAL_STORAGE = Kind(
    "env.rotational-storage", (WARN,), "the data path is on a rotational disk"
)
ENV_SHM = Kind("env.shm", (OK,), "/dev/shm is …")
ENV_SHM_MISSING = Kind("env.shm-missing", (WARN,), "/dev/shm is not mounted")
ENV_SHM_TOO_SMALL = Kind("env.shm-too-small", (CRIT,), "/dev/shm is only …")
ENV_SHM_UNKNOWN = Kind("env.shm-unknown", (INFO,), "/dev/shm size could not be read")
ENV_STORAGE = Kind("env.storage", (OK,), "… is in memory (…)")
ENV_TORCH_CPU_BUILD = Kind(
    "env.torch-cpu-build", (CRIT,), "torch … is a CPU-only build on a machine with … NVIDIA GPU…"
)

# --- io ----------------------------------------------------------------------------------

IO_COLD_CACHE_GAP = Kind(
    "io.cold-cache-gap",
    (INFO, OK),
    "A warm page cache makes this storage look …x faster than it is",
)
IO_FEW_READERS = Kind(
    "io.few-readers",
    (INFO, OK),
    "… concurrent readers read …x faster than one",
)
IO_NETWORK_STORAGE = Kind(
    "io.network-storage", (WARN,), "Training data is on …, a network or FUSE filesystem"
)
IO_ROTATIONAL = Kind(
    "io.rotational",
    (WARN, INFO),
    "Disk reports itself as rotational, but reads like flash",
)
IO_SMALL_FILES = Kind(
    "io.small-files",
    (CRIT, WARN, OK),
    "One file per sample reads …x slower than a shard",
)

# --- loader ------------------------------------------------------------------------------

LOADER_BATCH_TRANSFER = Kind(
    "loader.batch-transfer",
    (WARN, INFO),
    "Batches of … MiB cross from the workers to the training process",
)
LOADER_COPY_ON_READ = Kind(
    "loader.copy-on-read",
    (CRIT, WARN),
    "Workers copy Python objects on read (copy-on-write defeated): each grows memory",
)
LOADER_FIRST_BATCH_SLOW = Kind(
    "loader.first-batch-slow",
    (INFO, OK),
    "The first batch takes … s with … workers",
)
LOADER_IDLE_WORKERS = Kind(
    "loader.idle-workers",
    (WARN,),
    "… of … workers deliver (almost) nothing: the dataset gives … worker(s) data",
)
LOADER_MAIN_THREADS = Kind(
    "loader.main-threads",
    (INFO,),
    "At num_workers=0 your pipeline's torch operations run on the training process's threads",
)
LOADER_MDS_OVERHEAD = Kind(
    "loader.mds-overhead",
    (INFO,),
    "StreamingDataset delivers …x fewer samples/s than a plain shard here",
)
LOADER_OWN_CONFIG = Kind(
    "loader.own-config",
    (WARN, INFO, OK),
    "No worker count can be recommended: the measured figures cannot be true",
)
LOADER_OWN_DEMAND = Kind(
    "loader.own-demand",
    (CRIT, WARN, INFO, OK),
    "Your pipeline … up with the GPU (…x its demand)",
)
LOADER_START_METHOD = Kind(
    "loader.start-method",
    (WARN, INFO),
    "Under forkserver, Python 3.14's default on Linux, your pipeline loads …x as fast",
)
LOADER_REPEATS = Kind(
    "loader.repeats",
    (CRIT, WARN),
    "Batches repeat samples: workers or ranks deliver the same data",
)
LOADER_SHM = Kind("loader.shm", (WARN,), "… needs … MiB of /dev/shm; … MiB is free")
LOADER_SMALL_FILES = Kind(
    "loader.small-files",
    (CRIT, WARN, OK),
    "One file per sample loads …x slower than …",
)
LOADER_WORKERS = Kind(
    "loader.workers",
    (WARN, INFO, OK),
    "num_workers=… loads …x faster than num_workers=0",
)
LOADER_WORKERS_ABOVE_CPUS = Kind(
    "loader.workers-above-cpus",
    (WARN, INFO),
    "… workers delivered …x more than … on … CPUs: the workers wait more than they compute",
)

# --- starve ------------------------------------------------------------------------------

STARVE_FIRST_BATCH_SLOW = Kind(
    "starve.first-batch-slow", (INFO,), "The first batch takes … s with … workers"
)
STARVE_NOT_ENOUGH_CPU = Kind(
    "starve.not-enough-cpu",
    (CRIT, WARN),
    "No worker count is enough here: the GPU stays … idle",
)
STARVE_PIN_MEMORY = Kind(
    "starve.pin-memory",
    (INFO,),
    "Batches here are pageable: pin them so the copy to the GPU can overlap",
)
STARVE_WORKERS_ABOVE_CPUS = Kind(
    "starve.workers-above-cpus",
    (WARN, INFO),
    "… workers left the GPU … less idle than … on …",
)
STARVE_WORKERS_NEEDED = Kind(
    "starve.workers-needed", (OK,), "num_workers=… keeps the GPU fed (… idle)"
)
STARVE_WORKERS_ZERO = Kind(
    "starve.workers-zero",
    (CRIT, WARN, INFO, OK),
    "num_workers=0 leaves the GPU idle … of each step",
)

# --- pad ---------------------------------------------------------------------------------

PAD_TRUNCATED = Kind(
    "pad.truncated",
    (WARN, INFO),
    "… samples (…) are longer than the context of … tokens",
)
PAD_WASTE = Kind(
    "pad.waste",
    (CRIT, WARN, INFO, OK),
    "… spends … of each step on padding; … would do …x the real work",
)

# --- pcie --------------------------------------------------------------------------------

PCIE_LINK_BELOW_MAX = Kind(
    "pcie.link-below-max",
    (WARN, OK),
    "under load the PCIe link runs at …, below its maximum …",
)
PCIE_LOW_EFFICIENCY = Kind(
    "pcie.low-efficiency",
    (WARN, OK),
    "pinned host-to-device copies reach only … of the link's theoretical peak",
)
PCIE_NUMA_REMOTE = Kind(
    "pcie.numa-remote",
    (WARN, OK),
    "copies from NUMA node … lose … of the bandwidth of node …, the GPU's",
)
PCIE_OVERLAP = Kind(
    "pcie.overlap",
    (WARN, INFO, OK),
    "only pinned memory with non_blocking=True lets the CPU work while a batch crosses the bus",
)
PCIE_PAGEABLE_D2H = Kind(
    "pcie.pageable-d2h",
    (WARN, OK),
    "device-to-host copies into pageable memory collapse to … GB/s at …",
)
PCIE_REFERENCE = Kind(
    "pcie.reference",
    (INFO, OK),
    "torch's pinned H2D at … runs at … of a plain cudaMemcpy",
)

# --- profile -----------------------------------------------------------------------------

PROFILE_DATA_BOUND = Kind(
    "profile.data-bound",
    (CRIT, WARN, INFO, OK),
    "The loop is input-bound: … of each step waits for data",
    {  # given by profile's own sweep (advice/profile) and by a step breakdown (advice/trace)
        "fed": "The training step is fed: {share:.1%} of it waits for data{where}",
        "bound": "{whose} {kind}: {share:.0%} of {each} waits for data{more}",
    },
)
PROFILE_FIRST_STEP_STALL = Kind(
    "profile.first-step-stall", (INFO,), "The first step took …x the others"
)
PROFILE_GPU_IDLE = Kind(
    "profile.gpu-idle",
    (CRIT, WARN, INFO),
    "The GPU sits idle … of each step, and not for data",
)
PROFILE_H2D = Kind(
    "profile.h2d", (WARN,), "Host-to-device copies take … of each step, not overlapped with compute"
)
PROFILE_MEMCPY = Kind("profile.memcpy", (WARN,), "Host <-> device copies take … of each step")
PROFILE_SMALL_FILES = Kind(
    "profile.small-files",
    (CRIT, WARN, INFO, OK),
    "One file per sample waits … of the step longer than MDS shards",
)
PROFILE_STRAGGLER = Kind(
    "profile.straggler",
    (CRIT, WARN, INFO),
    "… is a straggler: every step waits … ms for it",
)
PROFILE_STRAGGLER_ROTATING = Kind(
    "profile.straggler-rotating",
    (CRIT, WARN, INFO),
    "A different rank holds up the step in … of … steps",
)
PROFILE_TOKENIZE = Kind(
    "profile.tokenize",
    (CRIT, WARN, INFO, OK),
    "Tokenizing in the loader waits … of the step longer than pre-tokenized shards",
)
PROFILE_WORKERS = Kind(
    "profile.workers",
    (CRIT, WARN, INFO, OK),
    "num_workers=… leaves … of each step waiting for data; … workers bring it to …",
)

# --- watch -------------------------------------------------------------------------------

WATCH_RANKS_SAME_BATCHES = Kind(
    "watch.ranks-same-batches",
    (CRIT,),
    "Every rank trains on the same samples: … ranks, one rank's worth of data",
)
WATCH_SET_EPOCH = Kind(
    "watch.set-epoch", (WARN,), "Your shuffling sampler (…) deals the same order every epoch"
)

# --- attach ------------------------------------------------------------------------------

ATTACH_DATA_WAIT = Kind(
    "attach.data-wait",
    (CRIT, WARN, INFO, OK),
    "How much of the job's time its training thread waits for data",
)
ATTACH_LOADER_BOUND = Kind(
    "attach.loader-bound",
    (WARN, INFO),
    "What bounds the DataLoader workers: CPU, I/O or the hand-over, and what to change",
)
ATTACH_LOAD_STAGE = Kind(
    "attach.load-stage",
    (WARN,),
    "…: most of its wait for data is … (… of it): that stage, and its fix",
)
ATTACH_NO_VERDICT = Kind(
    "attach.no-verdict", (INFO,), "What attach could not read of the job, and so does not judge"
)
ATTACH_STRAGGLER = Kind(
    "attach.straggler",
    (WARN,),
    "… is the straggler: it waits for data … of the time, the other ranks … (median)",
)
ATTACH_THROTTLED = Kind(
    "attach.throttled", (WARN,), "The job's cgroup was throttled in … of its CPU periods"
)
ATTACH_WORKER_MEMORY = Kind(
    "attach.worker-memory",
    (WARN,),
    "A DataLoader worker of … grew … MiB of memory of its own in … s",
)

# --- doctor ------------------------------------------------------------------------------

DOCTOR_STRAGGLER = Kind(
    "doctor.straggler",
    (CRIT, WARN),
    "… is a straggler: its data pipeline delivers … of the median node's",
)
DOCTOR_WEAKEST_LINK = Kind(
    "doctor.weakest-link",
    (CRIT, WARN),
    "The GPU waits for …: … samples/s against the … it consumes",
)


# Every kind, by its id.
CATALOGUE: dict[str, Kind] = {str(v): v for v in list(globals().values()) if isinstance(v, Kind)}
