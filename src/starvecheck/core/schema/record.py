"""A nested record of a stage's parameters as a dataclass: written with `to_dict`
(its field names are the JSON's keys: spelled once, as fields) and read back with
`from_dict`, which takes what a stored report holds and never raises: a value of the
wrong type (a report edited by hand) reads as the field's default, as parameters'
accessors do (core/parameters.py). And what a stage's figures as a record offer
(`FromMetrics`, read by `StageResult.records`) and judging's verdicts as one
(`FromVerdicts`, read by `Judged.read`)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from starvecheck.core.jsonvalue import JsonDict

if TYPE_CHECKING:
    from starvecheck.core.metric import LabelValue, Metric

R = TypeVar("R", bound="Record")
F = TypeVar("F", bound="FromMetrics")
V = TypeVar("V", bound="FromVerdicts")


class FromMetrics(Protocol):
    """A stage's figures as a record (core/schema/<stage>.py): the JSON's metrics are
    its serialisation, read back by labels, never raising on a stored report."""

    @classmethod
    def from_metrics(cls: type[F], metrics: Iterable[Metric]) -> F: ...

    def to_metrics(self) -> tuple[Metric, ...]: ...


class FromVerdicts(Protocol):
    """Judging's verdicts on a stage's figures as a record: the judgement's `verdicts`
    mapping is its serialisation."""

    @classmethod
    def from_verdicts(cls: type[V], verdicts: Mapping[str, LabelValue | None]) -> V: ...

    def to_verdicts(self) -> dict[str, LabelValue | None]: ...


_SCALARS: dict[type, tuple[type, ...]] = {
    bool: (bool,),
    int: (int,),
    float: (int, float),
    str: (str,),
}


def _accepts(kind: Any, value: object) -> bool:
    """Whether `value` (as JSON gives it) is of the annotated `kind`."""
    if kind is Any or kind is object:
        return True
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(k, value) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if origin is tuple:
        (item, *_) = typing.get_args(kind) or (Any,)
        return isinstance(value, list | tuple) and all(_accepts(item, v) for v in value)
    if origin in (dict, Mapping) or kind in (dict, Mapping):
        return isinstance(value, Mapping)
    allowed = _SCALARS.get(kind)
    if allowed is None:
        return False
    return isinstance(value, allowed) and (kind is bool or not isinstance(value, bool))


@dataclasses.dataclass(frozen=True)
class Record:
    """A nested record: subclasses are frozen dataclasses with a default for every
    field but the ones that identify the record."""

    _hints: ClassVar[dict[type, dict[str, Any]]] = {}

    @classmethod
    def _fields(cls) -> dict[str, Any]:
        if cls not in Record._hints:
            Record._hints[cls] = typing.get_type_hints(cls)
        return {f.name: Record._hints[cls][f.name] for f in dataclasses.fields(cls)}

    def to_dict(self) -> JsonDict:
        """The record as the JSON writes it (tuples as lists)."""
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        }

    @classmethod
    def from_dict(cls: type[R], d: object) -> R | None:
        """The record a stored report holds; None where it is no mapping or a field
        without a default is missing or of the wrong type."""
        if not isinstance(d, Mapping):
            return None
        given: dict[str, object] = {}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        for name, kind in cls._fields().items():
            value = d.get(name)
            if name in d and _accepts(kind, value):
                given[name] = tuple(value) if isinstance(value, list) else value
            elif name in required:
                return None
        return cls(**given)

    @classmethod
    def read_all(cls: type[R], values: object) -> tuple[R, ...]:
        """Each record of a stored list that reads as one."""
        if not isinstance(values, list | tuple):
            return ()
        return tuple(r for v in values if (r := cls.from_dict(v)) is not None)
