"""The user's own pipeline: `--factory FILE.py:FUNC` or `package.module:FUNC`.

`FUNC()` returns a map-style `Dataset`, an `IterableDataset` or a `DataLoader`. Given a
DataLoader, its batch size, sampler, collate_fn, worker_init_fn and settings are the
user's current configuration, which every other configuration is measured against.

The user's code is untrusted input (docs/architecture.md, principle 7): importing it and calling
FUNC may raise, print to stdout, or never return. Each of those ends in one line and
exit 2 (`UsageError`): the import, the call and the rest of the run have fd 1 on stderr
(core/streams.py: `--json -` stays one JSON document), under a time limit, and any exception becomes
"loader --factory SPEC: <what> raised <Type>: <message>" (the traceback only with
--debug, which the command line's error path handles).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.machinery
import importlib.util
import keyword
import operator
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starvecheck.core import clocks, streams
from starvecheck.core.signals import importing
from starvecheck.core.status import UsageError
from starvecheck.inputs.factory import FactorySpec, check_source
from starvecheck.stages.options import FactoryOptions

# How long importing the module and calling FUNC may take together (why: its option).
DEFAULT_FACTORY_TIMEOUT_S = FactoryOptions.factory_timeout_s


@dataclass
class Pipeline:
    """What FUNC returned: the dataset, and the user's DataLoader settings where it
    returned a DataLoader (`given` True), else torch's defaults with --batch-size."""

    spec: FactorySpec
    dataset: Any
    iterable: bool  # an IterableDataset (no sampler, no len() needed)
    given: bool  # FUNC returned a DataLoader: `settings` are the user's current ones
    settings: dict[str, Any] = field(default_factory=dict)
    length: int | None = None  # len(dataset) where it has one
    factory_s: float = 0.0  # importing and calling FUNC
    # A loader-like object FUNC returned: what the user's loop iterates, holding a
    # DataLoader (WebDataset's WebLoader, a DataPipeline whose first stage is one). It is
    # read as it is, in what it yields, never batched again; `rewrap(loader)` is a copy
    # of it with another DataLoader inside, so that DataLoader's settings (`settings`,
    # `dataset`) are what the sweep changes.
    outer: Any = None
    rewrap: Callable[[Any], Any] | None = None
    # An iterable holding no DataLoader (a generator, a loader of the user's own): read
    # as it is, once, in its one configuration: nothing of it can be swept.
    fixed: bool = False

    @property
    def current_workers(self) -> int:
        return int(self.settings.get("num_workers", 0) or 0)

    def describe(self) -> str:
        if self.fixed:
            return f"{type(self.outer).__name__} (an iterable, read as it is)"
        kind = "IterableDataset" if self.iterable else "Dataset"
        inner = f"{type(self.dataset).__name__} ({kind})"
        if self.outer is not None:
            return f"{type(self.outer).__name__} around a DataLoader of {inner}"
        return inner


def one_line(e: BaseException) -> str:
    """`Type: message`, the message on one line and cut to a readable length."""
    text = " ".join(str(e).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _module_name(path: str) -> str:
    """The name FILE.py is imported under: its own stem where that name, looked up on
    sys.path (its folder first), finds this file, so that workers started by spawn or
    forkserver (which get this sys.path) import it by that name to unpickle its
    classes; else (a name taken by a module already imported, or not an identifier) a
    private one, which only forked workers find."""
    stem = os.path.basename(path)[:-3]
    held = sys.modules.get(stem) if stem.isidentifier() and not keyword.iskeyword(stem) else 1
    # Free, or a factory file loaded before (an IterableDataset's, loaded again).
    if held is None or getattr(held, "_starvecheck_factory", False):
        with contextlib.suppress(ImportError, ValueError, OSError):
            found = importlib.machinery.PathFinder.find_spec(stem, sys.path)
            if found is not None and found.origin and os.path.samefile(found.origin, path):
                return stem
    return "_starvecheck_factory_" + re.sub(r"\W", "_", stem or "x")


def _import(spec: FactorySpec) -> Any:
    if spec.path is not None:
        check_source(spec.path)
        path = os.path.abspath(spec.path)
        # Its own directory is importable, as it is for `python FILE.py` (helpers next
        # to it), in workers too (spawn and forkserver pass sys.path on).
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = _module_name(path)
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise UsageError(f"--factory {spec.text}: cannot load {spec.path} as Python")
        module = importlib.util.module_from_spec(loader_spec)
        module._starvecheck_factory = True  # type: ignore[attr-defined]
        sys.modules[name] = module
        loader_spec.loader.exec_module(module)
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # package.module importable from here
    return importlib.import_module(spec.module or "")


def call_limited(call: Callable[[], Any], limit_s: float, what: str) -> Any:
    """call() with a SIGALRM limit where one can be set (the main thread, no timer of
    someone else's running); without one, unbounded."""
    import signal

    class _Late(BaseException):
        pass

    def ring(signum: int, frame: object) -> None:
        raise _Late()

    try:
        if limit_s <= 0 or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
            return call()
        previous = signal.signal(signal.SIGALRM, ring)
    except ValueError:  # not the main thread
        return call()
    try:
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            return call()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Late:
        raise UsageError(
            f"{what} did not return in {limit_s:,.0f} s (raise --factory-timeout if it "
            "really takes this long)"
        ) from None
    finally:
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


def load(
    spec: FactorySpec, batch_size: int | None, limit_s: float = DEFAULT_FACTORY_TIMEOUT_S
) -> Pipeline:
    """Import the module, call FUNC, and read what it returned."""
    started = clocks.perf_counter()
    where = f"loader --factory {spec.text}"
    # torch first, with signals held (signals.importing): the module's own `import
    # torch` then finds it loaded, so neither a signal nor the time limit's SIGALRM
    # raises inside torch's C++ start-up.
    with importing("torch"):
        import torch  # noqa: F401

    # From here to the run's end the user's prints (this process's, its threads', the
    # workers') go to stderr, so a report on stdout (`--json -`) stays whole.
    streams.move()

    def run() -> Any:
        try:
            module = _import(spec)
        except UsageError:
            raise
        except SyntaxError as e:
            raise UsageError(
                f"{where}: importing it raised SyntaxError: {e.msg} (line {e.lineno})"
            ) from e
        except (Exception, SystemExit) as e:  # not Ctrl-C, SIGTERM or the time limit
            raise UsageError(f"{where}: importing it raised {one_line(e)}") from e
        func = getattr(module, spec.func, None)
        if func is None:
            raise UsageError(f"{where}: the module has no {spec.func!r}")
        if not callable(func):
            raise UsageError(f"{where}: {spec.func!r} is a {type(func).__name__}, not a function")
        try:
            return func()
        except UsageError:
            raise
        except (Exception, SystemExit) as e:
            raise UsageError(f"{where}: {spec.func}() raised {one_line(e)}") from e

    made = call_limited(run, limit_s, f"{where}: importing it and calling {spec.func}()")
    pipeline = from_object(spec, made, batch_size)
    pipeline.factory_s = clocks.perf_counter() - started
    return pipeline


def from_object(spec: FactorySpec, made: Any, batch_size: int | None) -> Pipeline:
    """A Pipeline from what FUNC returned, or one line saying it is none of the three."""
    with importing("torch"):
        from torch.utils.data import DataLoader, Dataset, IterableDataset

    where = f"loader --factory {spec.text}"
    outer: Any = None
    rewrap: Callable[[Any], Any] | None = None
    wrapped = None if isinstance(made, DataLoader) else _inner_loader(made)
    if wrapped is not None:
        outer, (inner, rewrap) = made, wrapped
        made = inner  # its settings are what the sweep changes; `made` is read as it is
    if isinstance(made, DataLoader):
        settings = loader_settings(made)
        if batch_size is not None and outer is None:
            settings["batch_size"] = batch_size
            settings.pop("batch_sampler", None)
        dataset = made.dataset
        given = True
    elif isinstance(made, Dataset | IterableDataset):
        dataset, given = made, False
        # As a training loop reads a map-style dataset: shuffled.
        settings = {"batch_size": batch_size or 32, "num_workers": 0}
        if not isinstance(made, IterableDataset):
            settings["shuffle"] = True
    elif _iterable(made):
        return Pipeline(spec, made, True, True, {"num_workers": 0}, None, outer=made, fixed=True)
    else:
        raise UsageError(
            f"{where}: {spec.func}() returned a {type(made).__name__}, not a torch Dataset, "
            "IterableDataset, DataLoader or an iterable of batches"
        )
    iterable = isinstance(dataset, IterableDataset)
    length = None
    if not iterable:
        length = _length(dataset, where)
    return Pipeline(spec, dataset, iterable, given, settings, length, outer=outer, rewrap=rewrap)


def _length(dataset: Any, where: str) -> int:
    """len(dataset), or one line: no __len__, a __len__ that raises, or one that returns
    anything but a positive integer (a float, a negative number)."""
    if getattr(type(dataset), "__len__", None) is None:
        raise UsageError(f"{where}: the map-style dataset has no __len__")
    try:
        value = type(dataset).__len__(dataset)
    except (Exception, SystemExit) as e:
        raise UsageError(f"{where}: len(dataset) raised {one_line(e)}") from e
    try:
        length = operator.index(value)  # what len() accepts: an int, numpy's integers
    except TypeError:
        shown = f" ({value!r})" if isinstance(value, float | str) else ""
        raise UsageError(
            f"{where}: the dataset's __len__ returned a {type(value).__name__}{shown[:60]}, "
            "not an integer"
        ) from None
    if length <= 0:
        raise UsageError(f"{where}: the dataset is empty (__len__ returned {length})")
    return length


def _iterable(made: Any) -> bool:
    """A loader of the user's own: a generator, an iterator, an object with __iter__;
    not a container of samples (a list is a dataset without __getitem__'s contract)."""
    if isinstance(made, str | bytes | dict | list | tuple | set | frozenset):
        return False
    return callable(getattr(type(made), "__iter__", None))


def _inner_loader(made: Any) -> tuple[Any, Callable[[Any], Any]] | None:
    """(the DataLoader a loader-like object holds, a function making a copy of it with
    another DataLoader in its place), where `made` holds one: in a list of stages
    (`pipeline`, as WebDataset's DataPipeline and WebLoader keep it) or as an attribute.
    One level deep: the user's object is not searched further."""
    with importing("torch"):
        from torch.utils.data import DataLoader

    fields = getattr(made, "__dict__", None)
    if not isinstance(fields, dict):
        return None
    for name, value in fields.items():
        if isinstance(value, DataLoader):

            def swap(loader: Any, name: str = name) -> Any:
                new = copy.copy(made)
                setattr(new, name, loader)
                return new

            return value, swap
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, DataLoader):

                    def swap_item(loader: Any, name: str = name, i: int = i) -> Any:
                        new = copy.copy(made)
                        stages = list(getattr(made, name))
                        stages[i] = loader
                        setattr(new, name, stages)
                        return new

                    return item, swap_item
    return None


# The DataLoader arguments read back from a user's DataLoader: everything that shapes
# its batches (sampler, collate) and how it loads them.
def loader_settings(dl: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "num_workers": int(dl.num_workers),
        "pin_memory": bool(dl.pin_memory),
        "persistent_workers": bool(getattr(dl, "persistent_workers", False)),
        "timeout": float(getattr(dl, "timeout", 0) or 0),
        "collate_fn": dl.collate_fn,
        "worker_init_fn": dl.worker_init_fn,
        "drop_last": bool(dl.drop_last),
        "generator": dl.generator,
        "multiprocessing_context": dl.multiprocessing_context,
    }
    if dl.num_workers and getattr(dl, "prefetch_factor", None) is not None:
        out["prefetch_factor"] = int(dl.prefetch_factor)
    if getattr(dl, "in_order", True) is False:
        out["in_order"] = False
    with importing("torch"):
        from torch.utils.data import IterableDataset

    if not isinstance(dl.dataset, IterableDataset):
        if dl.batch_size is None and dl.batch_sampler is not None:  # the user's own
            out["batch_sampler"] = dl.batch_sampler
        else:  # batches of batch_size, or (None) samples that are batches already
            out["sampler"] = dl.sampler
    out["batch_size"] = dl.batch_size
    return out
