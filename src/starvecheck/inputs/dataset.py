"""The samples of `pad --dataset`: from each record, the fields to measure (`--field`,
else `text` or `input_ids`), as text to tokenize, a count of token ids, or chat
messages. Apart from the records because what a sample is (which fields, how they
join, what is assumed where one is missing) is the same question in every format;
and what is held is bounded here, whatever the file unpacks to.

Every problem is a `UsageError` naming the file, the record, and what was expected:
one line, exit 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starvecheck.core.status import UsageError
from starvecheck.inputs.records import RECORD_CHARS, parquet_columns, records
from starvecheck.inputs.streams import Cut

# A text sample is cut to this many characters per token of the context before it is
# tokenized: tokens of English or code average 3 to 5 characters and BPE's longest run
# to a few dozen, so what is cut away lies past the context, which training truncates.
CHARS_PER_TOKEN = 64
# Without --limit, the samples held are bounded whatever the file unpacks to: their
# text, each sample counted with SAMPLE_COST characters more for what Python spends on
# it, is at most MAX_HELD. --limit N lifts it: the first N samples are read, however
# many that is.
MAX_HELD = 2 << 30
SAMPLE_COST = 64


Sample = str | int | list  # text, a token count (pre-tokenized), or chat messages


@dataclass
class Samples:
    """What was read: one entry per sample, and what had to be assumed on the way."""

    items: list[Sample] = field(default_factory=list)
    fields: tuple[str, ...] = ()
    missing: dict[str, int] = field(default_factory=dict)  # field -> records without it
    records: int = 0
    cut: int = 0  # texts cut to max_chars before tokenizing

    @property
    def pretokenized(self) -> bool:
        return bool(self.items) and all(isinstance(s, int) for s in self.items)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value[:64]
    )


def _is_chat(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and "content" in m for m in value[:64])
    )


def _value(path: str, where: str, name: str, value: Any) -> Sample:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if _is_ids(value) and value:
        return len(value)
    if _is_chat(value):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    kinds = {bool: "a boolean", int: "a number", float: "a number", dict: "an object"}
    kind = kinds.get(type(value), f"a {type(value).__name__}")
    raise UsageError(
        f"--dataset {path}: {where}: field {name!r} holds {kind}; --field names text, "
        "token ids or chat messages"
    )


def read_samples(
    path: str,
    fmt: str,
    fields: Sequence[str],
    limit: int | None = None,
    max_chars: int = RECORD_CHARS,
) -> Samples:
    """The samples of a dataset file: each record's fields joined by a newline, each
    text cut to `max_chars` (pad passes what its context can hold: `CHARS_PER_TOKEN`
    per token), so memory is bounded by the context and not by the longest record.

    With no --field: `text` if the first record has it, else `input_ids`, else an
    error listing the fields there are. A field may hold text, token ids (counted,
    not tokenized) or chat messages (a list of {"role", "content"})."""
    max_chars = min(max_chars, RECORD_CHARS)
    if fmt == "text":
        return _text_samples(path, fields, limit, max_chars)
    out = Samples(fields=tuple(fields))
    held = 0  # characters held, for MAX_HELD
    chosen: tuple[str, ...] = tuple(fields)
    columns: Sequence[str] | None = chosen or None
    if not chosen and fmt == "parquet":  # read one column, not the whole table
        names = parquet_columns(path)
        columns = next(([g] for g in ("text", "input_ids") if g in names), names[:1])
    for where, record in records(path, fmt, columns):
        if not isinstance(record, dict):
            kind = "a list" if isinstance(record, list) else type(record).__name__
            raise UsageError(
                f"--dataset {path}: {where}: expected an object with named fields, found {kind}"
            )
        if not chosen:
            for guess in ("text", "input_ids"):
                if guess in record:
                    chosen = (guess,)
                    break
            else:
                raise UsageError(
                    f"--dataset {path}: no 'text' field; name the field(s) to measure with "
                    f"--field (the first record has: {_names(record)})"
                )
            out.fields = chosen
        if out.records == 0:
            absent = [f for f in chosen if f not in record]
            if len(absent) == len(chosen):
                raise UsageError(
                    f"--field {', '.join(absent)}: not in {path} (the first record has: "
                    f"{_names(record)})"
                )
        out.records += 1
        parts: list[Sample] = []
        for name in chosen:
            if name not in record:
                out.missing[name] = out.missing.get(name, 0) + 1
                continue
            parts.append(_value(path, where, name, record[name]))
        joined = _join(path, where, parts)
        if isinstance(joined, str) and len(joined) > max_chars:
            joined = joined[:max_chars]
            out.cut += 1
        out.items.append(joined)
        if limit is not None and out.records >= limit:
            break
        held = _held(path, held, joined, limit)
    if not out.items:
        raise UsageError(f"--dataset {path}: no records")
    for name, n in out.missing.items():
        if n == out.records:
            raise UsageError(f"--field {name}: in no record of {path}")
    return out


def _text_samples(path: str, fields: Sequence[str], limit: int | None, max_chars: int) -> Samples:
    """A plain text file's samples: one a line, blank lines skipped."""
    if fields:
        raise UsageError(
            f"--field: {path} is plain text, one sample per line; --field applies to "
            "JSON Lines, JSON, Parquet and CSV (use --format to say which it is)"
        )
    out = Samples()
    held = 0
    for _, line in records(path, "text", max_chars=max_chars):
        out.items.append(str(line))
        out.cut += isinstance(line, Cut)
        out.records += 1
        if limit is not None and out.records >= limit:
            break
        held = _held(path, held, line, limit)
    if not out.items:
        raise UsageError(f"--dataset {path}: no samples (every line is blank)")
    return out


def _held(path: str, held: int, sample: Sample, limit: int | None) -> int:
    """`held` and this sample's share (its text's characters and SAMPLE_COST); past
    MAX_HELD with no --limit, one line."""
    if isinstance(sample, str):
        held += len(sample)
    elif isinstance(sample, list):  # chat messages
        held += sum(len(str(m.get("content") or "")) for m in sample if isinstance(m, dict))
    held += SAMPLE_COST
    if limit is None and held > MAX_HELD:
        raise UsageError(
            f"--dataset {path}: more than {MAX_HELD >> 30} Gi characters of samples, more "
            "than pad holds unasked: measure the first N with --limit N"
        )
    return held


def _names(record: dict[str, Any]) -> str:
    names = list(record)
    shown = ", ".join(str(n) for n in names[:12])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 12 else "") or "no fields"


def _join(path: str, where: str, parts: list[Sample]) -> Sample:
    if len(parts) == 1:
        return parts[0]
    if any(not isinstance(p, str) for p in parts):
        raise UsageError(
            f"--dataset {path}: {where}: only text fields can be joined; token ids and chat "
            "messages go in a --field of their own"
        )
    return "\n".join(p for p in parts if isinstance(p, str))
