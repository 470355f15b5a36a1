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
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

if TYPE_CHECKING:
    from starvecheck.core.schema.record import Record

T = TypeVar("T")
R = TypeVar("R", bound="Record")
P = TypeVar("P", bound="Parameters")


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


@overload
def whole(key: str | None = None, *, absent: int) -> _Key[int]: ...
@overload
def whole(key: str | None = None, absent: None = None) -> _Key[int | None]: ...
def whole(key: str | None = None, absent: int | None = None) -> _Key[int] | _Key[int | None]:
    return _Key(_whole, absent, key)


def text(key: str | None = None) -> _Key[str | None]:
    return _Key(_text, None, key)


def flag(key: str | None = None) -> _Key[bool]:
    return _Key(bool, False, key)


def items(key: str | None = None) -> _Key[tuple[Any, ...]]:
    return _Key(_items, (), key)


def counts(key: str | None = None) -> _Key[tuple[Any, ...]]:
    """A list of counts measured, read as (1,) where absent or empty."""
    return _Key(lambda v: _items(v) or (1,), (1,), key)


def mapping(key: str | None = None) -> _Key[Mapping[str, Any]]:
    return _Key(_mapping, {}, key)


class Parameters(Mapping[str, object]):
    """A stage's parameters: a read-only mapping of what it wrote, with an accessor
    for each key another layer reads. The keys every sweeping stage writes are here;
    each stage's own are on its subclass, in its vocabulary module
    (core/schema/<stage>.py): `r.parameters.read(schema.pad.Parameters).context`."""

    __slots__ = ("_as", "_values")

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        self._values = dict(values or {})
        self._as: dict[type[Parameters], Parameters] = {}  # read(): each class made once

    def __getitem__(self, key: str) -> object:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Parameters({self._values!r})"

    @classmethod
    def of(cls: type[P], values: Mapping[str, object]) -> P:
        """`values` as these Parameters (itself where it is of this class already): a
        stage's reader says whose parameters it reads (core/schema/<stage>.py)."""
        return values if isinstance(values, cls) else cls(values)

    # Every stage that sweeps num_workers, and watch: the CPUs DataLoader workers get
    # (affinity and quota) as recorded, a fraction where ranks share a host (watch);
    # `cpus` the same as a whole count, at least 1 (1 where none was recorded).
    effective_cpus = number()
    cpus = _Key(_cpus, 1, "effective_cpus")
    # The batch and the step judged against (loader, starve, factory, pad, doctor).
    batch_size = whole()
    step_ms = number()

    def read(self, kind: type[P]) -> P:
        """These parameters as `kind`, a stage's own (core/schema/<stage>.py)."""
        if isinstance(self, kind):
            return self
        made = self._as.get(kind)
        if made is None:
            made = self._as[kind] = kind(self._values)
        return made  # type: ignore[return-value]


def records(kind: type[R]) -> _Key[tuple[R, ...]]:
    """A list of nested records, each read back as `kind` (core/schema/record.py);
    an entry that does not read as one is left out."""
    return _Key(kind.read_all, ())
