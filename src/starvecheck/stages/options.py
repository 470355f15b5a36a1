"""Each stage's options, typed: what its command hands `Stage.plan`.

One frozen dataclass per stage, and each default is written once, here: the command's
help text reads it from the dataclass, the stage's plan falls back to it. A field whose
default depends on the run (`--quick`, `--existing`, the effective CPUs) is None until
the plan resolves it, from the tables and functions below. Values arrive parsed
(`cli/args.py`, called by cli/): counts as tuples, sizes in bytes, paths checked; a stage
checks only how options combine. Nothing here imports more than the standard library,
so the CLI reads it at start-up for free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from starvecheck.inputs.factory import FactorySpec
    from starvecheck.probe.sysroot import SysRoot

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# --batch-timeout, where a command iterates a DataLoader (loader, starve, profile,
# doctor): far above any healthy batch of theirs (the slowest, a cold first batch behind
# worker start-up and Streaming's set-up on network storage, takes seconds; starve adds
# its simulated work on top), and well inside a CI job's own time limit, so that a hang
# ends with its cause named instead of a job killed without a word.
BATCH_TIMEOUT_S = 120.0

# Bounds the commands check a value against, where more than one command takes it.
MOST_SECONDS = 86_400.0  # a time limit or a period (--batch-timeout, --every, ...): a day
MOST_SAMPLES = 10_000_000  # --samples (io, loader)
MOST_RUNS = 1000  # --runs (io, loader, pcie)
MOST_BATCH = 100_000  # a DataLoader's --batch-size (loader, starve)

# The default sweep's top: twice the effective CPUs, at least this.
SWEEP_TOP_AT_LEAST = 4
# The default sweep as help states it.
DEFAULT_WORKERS_TEXT = (
    f"0, 1, 2, 4, ... up to twice the effective CPUs, at least {SWEEP_TOP_AT_LEAST}"
)


def default_workers(effective: int) -> tuple[int, ...]:
    """num_workers to sweep when none are given (DEFAULT_WORKERS_TEXT)."""
    counts, w = [0, 1], 2
    while w <= max(SWEEP_TOP_AT_LEAST, 2 * effective):
        counts.append(w)
        w *= 2
    return tuple(counts)


def default_threads(effective: int | None) -> tuple[int, ...]:
    """Concurrent readers when none are given: 1 and the effective CPU count."""
    return tuple(sorted({1, max(1, effective or 1)}))


def size_text(size: int) -> str:
    """A default size as help shows it, in the units --sample-size reads: 16 KiB -> '16K'."""
    for unit, scale in (("G", GiB), ("M", MiB), ("K", KiB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def size_list(sizes: tuple[int, ...]) -> str:
    """(64 KiB, 1 MiB) -> '64K,1M', as --sizes reads them."""
    return ",".join(size_text(s) for s in sizes)


def number(value: float) -> str:
    """A default number as help states it: 5 -> '5', 10.0 -> '10', 0.5 -> '0.5'."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def by_quick(table: dict[bool, int] | dict[bool, float]) -> str:
    """A --quick-dependent default as help states it: '5; 3 with --quick'."""
    return f"{number(table[False])}; {number(table[True])} with --quick"


@dataclass(frozen=True)
class AttachOptions:
    pid: int  # the training process, or a torchrun agent
    seconds: float | None = None  # --duration; None: SECONDS[quick]
    rate: int = 50  # samples a second, at most RATE_CEILING
    all_ranks: bool = False  # --all: every rank beside PID on this node
    quick: bool = False

    stage: ClassVar[str] = "attach"
    SECONDS: ClassVar[dict[bool, float]] = {False: 10.0, True: 5.0}
    # --duration's bounds: the shortest window that samples anything, the longest a
    # caveat may name (stages/attach/costs.py).
    MIN_SECONDS: ClassVar[float] = 1.0
    MAX_SECONDS: ClassVar[float] = 600.0
    # Never more samples a second, whatever is asked (--rate's bound; py-spy's cost
    # grows with it: docs/commands/attach.md, "What attach costs the job").
    RATE_CEILING: ClassVar[int] = 200

    @property
    def window_s(self) -> float:
        """The seconds one window samples: --duration, else SECONDS[quick]."""
        return self.seconds or self.SECONDS[self.quick]


@dataclass(frozen=True)
class EnvOptions:
    root: SysRoot | None = None  # the machine described; None: / or STARVECHECK_SYSROOT
    path: str | None = None  # the data directory whose storage to describe; None: cwd

    stage: ClassVar[str] = "env"


@dataclass(frozen=True)
class IoOptions:
    path: str  # checked (args.data_path)
    existing: bool = False
    sample_size: int = 16 * KiB
    samples: int | None = None  # None: SAMPLES[existing][quick]
    runs: int | None = None  # None: RUNS[quick]
    threads: tuple[int, ...] | None = None  # None: default_threads(effective CPUs)
    cold: bool = True
    drop_caches: bool = False
    keep: bool = False
    quick: bool = False

    stage: ClassVar[str] = "io"
    # Existing mode reads real files, fewer by default (each may be large, the storage
    # remote). doctor runs the generated sizes.
    SAMPLES: ClassVar[dict[bool, dict[bool, int]]] = {
        False: {False: 10_000, True: 2_000},
        True: {False: 1_000, True: 200},
    }
    RUNS: ClassVar[dict[bool, int]] = {False: 5, True: 3}


@dataclass(frozen=True)
class LoaderOptions:
    path: str  # checked (args.data_path)
    existing: bool = False
    sample_size: int = 16 * KiB
    samples: int | None = None  # None: SAMPLES[existing][quick]
    workers: tuple[int, ...] | None = None  # None: default_workers(effective CPUs)
    runs: int = 3  # epochs per layout, cache state and worker count
    batch_size: int | None = None  # None: BATCH_SIZE
    prefetch_factor: int = 2
    pin_memory: bool | None = None  # None: when a CUDA device is present
    cold: bool = True
    quick: bool = False

    stage: ClassVar[str] = "loader"
    BATCH_SIZE: ClassVar[int] = 32
    # --quick fits in 30 s on 2 cores; doctor runs the generated sizes.
    SAMPLES: ClassVar[dict[bool, dict[bool, int]]] = {
        False: {False: 5_000, True: 1_000},
        True: {False: 1_000, True: 200},
    }


@dataclass(frozen=True)
class FactoryOptions:
    """`loader --factory`: the user's own pipeline instead of data generated under a
    path (stages/loader/factory/)."""

    spec: FactorySpec  # parsed where it entered (cli/args.py, inputs/workload.py)
    batch_size: int | None = None  # None: the pipeline's own
    workers: tuple[int, ...] | None = None  # None: the default sweep
    quick: bool = False
    # How long importing the module and calling FUNC may take together (a factory that
    # downloads, or scans a huge directory, says so by taking long; one that never
    # returns ends here). --batch-timeout bounds each batch separately.
    factory_timeout_s: float = 300.0
    # Seconds each configuration is read for, over all its rounds; None: BUDGET_S[quick]
    budget_s: float | None = None
    step_ms: float | None = None  # the GPU's step, to judge against

    stage: ClassVar[str] = "factory"
    BUDGET_S: ClassVar[dict[bool, float]] = {False: 10.0, True: 3.0}


@dataclass(frozen=True)
class StarveOptions:
    sample_ms: float | None = None  # D; None: ASSUMED_SAMPLE_MS, and said to be assumed
    batch_size: int = 32  # B
    step_ms: float | None = None  # G; None: ASSUMED_STEP_MS, and said to be assumed
    workers: tuple[int, ...] | None = None  # None: default_workers(effective CPUs)
    steps: int | None = None  # None: STEPS[quick]
    sleep: bool = False
    tokenizer: str | None = None
    quick: bool = False

    stage: ClassVar[str] = "starve"
    ASSUMED_SAMPLE_MS: ClassVar[float] = 5.0
    ASSUMED_STEP_MS: ClassVar[float] = 50.0
    STEPS: ClassVar[dict[bool, int]] = {False: 20, True: 8}
    WARMUP_STEPS: ClassVar[int] = 3


@dataclass(frozen=True)
class PadOptions:
    context: int = 4096
    batch_size: int = 32
    current: str = "dynamic"
    seed: int = 0
    limit: int | None = None  # None: all, or QUICK_LIMIT with --quick on the user's data
    dataset: str | None = None
    format: str | None = None  # None: from the file name
    fields: tuple[str, ...] = ()  # split and checked (args.fields)
    tokenizer: str | None = None
    lengths: str | None = None  # a file of lengths, or "-" for stdin
    stdin: IO[str] | None = None  # what "-" reads
    quick: bool = False

    stage: ClassVar[str] = "pad"
    QUICK_LIMIT: ClassVar[int] = 20_000


@dataclass(frozen=True)
class PcieOptions:
    sizes: tuple[int, ...] | None = None  # bytes; None: SIZES[quick]
    runs: int | None = None  # None: RUNS[quick]
    quick: bool = False

    stage: ClassVar[str] = "pcie"
    SIZES: ClassVar[dict[bool, tuple[int, ...]]] = {
        False: (64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB),
        True: (MiB, 16 * MiB, 256 * MiB),
    }
    RUNS: ClassVar[dict[bool, int]] = {False: 10, True: 5}


@dataclass(frozen=True)
class ProfileOptions:
    path: str  # checked (args.data_path)
    workers: tuple[int, ...] | None = None  # None: 0 and the effective CPUs, at most MAX
    steps: int | None = None  # None: STEPS[quick]
    model_size: str = "auto"  # auto: tiny on CPU, small on CUDA
    device: str = "auto"
    cold: bool = False
    trace_dir: str | None = None  # made and checked (args.output_dir)
    tokenizer: str | None = None
    quick: bool = False

    stage: ClassVar[str] = "profile"
    STEPS: ClassVar[dict[bool, int]] = {False: 20, True: 6}
    MAX_DEFAULT_WORKERS: ClassVar[int] = 8


@dataclass(frozen=True)
class TraceOptions:
    traces: tuple[str, ...]  # files or directories of torch.profiler traces
    # The most JSON one file may hold, unpacked (None: no limit): it is decoded whole, so
    # this bounds the memory a file costs (about as much again for its events). A real
    # job's trace is hundreds of MB; --max-trace-bytes raises it.
    max_bytes: int | None = 4 << 30
    # The most seconds reading and analysing them may take (None: no limit).
    max_seconds: float | None = 600.0

    stage: ClassVar[str] = "trace"


StageOptions = (
    AttachOptions
    | EnvOptions
    | IoOptions
    | LoaderOptions
    | FactoryOptions
    | StarveOptions
    | PadOptions
    | PcieOptions
    | ProfileOptions
    | TraceOptions
)
