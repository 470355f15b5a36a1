"""The workload a `doctor` run is judged against: what one training step asks of the
input pipeline.

Every link's capacity is stated in samples per second *for this workload*, and the
GPU's demand is batch_size / step time, so the same machine can be fine for one job
and starving for another. The defaults describe a typical small LLM fine-tune (see
the README, "doctor", for their basis); each value remembers where it came from
(default, option, file, measured, assumed) so the report can say so.

Values come from a TOML file (`--workload FILE.toml`, the same keys), then command-line
options, which override the file. Every bad value is one `UsageError` naming the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import ClassVar

from starvecheck.core.jsonvalue import JsonDict, JsonObject
from starvecheck.core.status import UsageError
from starvecheck.core.strategies import STRATEGIES
from starvecheck.core.units import format_bytes, parse_size
from starvecheck.inputs.factory import FactorySpec, parse_spec
from starvecheck.inputs.files import open_input, read_all

LAYOUTS = ("shard", "small_files")
# With no CUDA device the GPU step cannot be measured: this figure stands in, said to
# be assumed wherever it is used. 400 ms is the order of a 1B-parameter model's step at
# batch 16 x 2,048 tokens on one data-centre GPU (about 6 x 1e9 x 32,768 FLOPs at 40%
# of ~1 PFLOP/s of bf16), so a CPU-only run still judges the pipeline against a GPU.
ASSUMED_STEP_MS = 400.0
MAX_SAMPLE_SIZE = 1 << 30
# A workload file holds a dozen keys: a few hundred bytes. More than this is not one.
MAX_FILE_BYTES = 1 << 20
# The deepest a workload file is read (arrays, inline tables, the parts of a dotted
# key): its keys are flat and `field` is a list, two levels. tomllib recurses once per
# level (a few hundred is a RecursionError) and walks a dotted key once per part for
# each part (100,000 parts take hours), so a deeper file is refused before it is parsed.
MAX_DEPTH = 32

# key: (kind, low, high). kind: int, float, size, choice, text, texts, factory.
_RULES: dict[str, tuple[str, object, object]] = {
    "batch_size": ("int", 1, 1_000_000),
    "context": ("int", 1, 10_000_000),
    "sample_size": ("size", 1, MAX_SAMPLE_SIZE),
    "cpu_ms_per_sample": ("float", 0.0, 10_000.0),
    "step_ms": ("float", 0.001, 600_000.0),
    "token_bytes": ("int", 1, 8),
    "layout": ("choice", LAYOUTS, None),
    "current": ("choice", STRATEGIES, None),
    "dataset": ("text", None, None),
    "field": ("texts", None, None),
    "tokenizer": ("text", None, None),
    "factory": ("factory", None, None),
}
ALIASES = {"seq_len": "context"}

# A workload value as checked: a count, a time, a name, the fields, the factory.
Value = int | float | str | tuple[str, ...] | FactorySpec | None


def bounds(key: str) -> tuple[float, float]:
    """The range a number of the workload must lie in (the command line checks its
    options against the same)."""
    _, low, high = _RULES[key]
    return float(low), float(high)


@dataclass(frozen=True)
class Workload:
    batch_size: int = 16
    context: int = 2048  # tokens per sample at most (seq_len, max_length)
    sample_size: int = 8 << 10  # bytes per sample on disk
    cpu_ms_per_sample: float = 2.0  # preprocessing in a DataLoader worker
    step_ms: float | None = None  # GPU time per step; None until measured or assumed
    token_bytes: int = 8  # bytes per token id sent to the GPU (int64, torch's default)
    layout: str = "shard"
    current: str = "dynamic"  # pad's strategy trained with today
    dataset: str | None = None
    field: tuple[str, ...] = ()
    tokenizer: str | None = None
    # The user's own pipeline (FILE.py:FUNC): the loader link is measured on it.
    factory: FactorySpec | None = None
    # key -> "default", "option", "file", "measured" or "assumed"
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)

    # The command whose options these are: doctor's defaults are declared here, as each
    # other command's are in its options record (stages/options.py), and its help reads
    # them (tests/test_options.py checks every command's).
    stage: ClassVar[str] = "doctor"

    def source(self, key: str) -> str:
        return self.sources.get(key, "default")

    def set(self, key: str, value: Value, source: str) -> Workload:
        return replace(self, **{key: value}, sources={**self.sources, key: source})

    @property
    def demand(self) -> float | None:
        """Samples per second the GPU consumes: batch_size per step."""
        if not self.step_ms:
            return None
        return self.batch_size / (self.step_ms / 1000)

    @property
    def wire_bytes_per_sample(self) -> int:
        """Bytes one sample takes on PCIe: context token ids of token_bytes each."""
        return self.context * self.token_bytes

    def to_dict(self) -> JsonDict:
        """{key: {"value": ..., "source": ...}}, in declaration order."""
        out: JsonDict = {}
        for f in fields(self):
            if f.name == "sources":
                continue
            value = getattr(self, f.name)
            if f.name == "factory":
                if value is None:
                    continue  # a report without one reads as before it existed
                value = value.text
            out[f.name] = {
                "value": list(value) if isinstance(value, tuple) else value,
                "source": self.source(f.name),
            }
        return out

    @classmethod
    def from_dict(cls, d: JsonObject) -> Workload:
        values = {k: v["value"] for k, v in d.items() if k in _FIELDS}
        if "field" in values:
            values["field"] = tuple(values["field"] or ())
        if values.get("factory") is not None:
            values["factory"] = parse_spec(values["factory"])
        return cls(**values, sources={k: v["source"] for k, v in d.items() if k in _FIELDS})


_FIELDS = {f.name for f in fields(Workload)} - {"sources"}


def check(key: str, value: object, where: str) -> Value:
    """One value, checked and converted; `where` names its origin in the error."""
    kind, low, high = _RULES[key]
    bad = f"{where}: {key} = {_show(value)}"
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{bad}: expected a whole number")
        if not low <= value <= high:
            raise UsageError(f"{bad}: expected {low:,} to {high:,}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{bad}: expected a number")
        if not low <= float(value) <= high:  # NaN fails both comparisons
            raise UsageError(f"{bad}: expected {low:g} to {high:,g}")
        return float(value)
    if kind == "size":
        size = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str):
            size = parse_size(value)
        if size is None:
            raise UsageError(f"{bad}: expected bytes or a size such as 8KiB")
        if not low <= size <= high:
            raise UsageError(f"{bad}: expected 1 byte to {format_bytes(high)}")
        return size
    if kind == "choice":
        if value not in low:
            raise UsageError(f"{bad}: expected one of {', '.join(low)}")
        return value
    if kind in ("text", "factory"):
        if not isinstance(value, str) or not value.strip():
            raise UsageError(f"{bad}: expected a non-empty string")
        return value if kind == "text" else parse_spec(value)
    # texts: a name or a list of names ("instruction,input,output" splits)
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, str) for v in items):
        raise UsageError(f"{bad}: expected a field name or a list of them")
    names = tuple(n.strip() for v in items for n in v.split(","))
    if any(not n for n in names):
        raise UsageError(f"{bad}: empty field name")
    return names


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_file(path: str) -> dict[str, Value]:
    """A workload TOML file -> checked values. Unknown keys, wrong types, values out of
    range and unreadable or malformed files are one usage error each."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError as e:
            raise UsageError("--workload needs Python 3.11 or the tomli package") from e
    where = f"--workload {path}"
    deep = UsageError(
        f"{where}: nested deeper than {MAX_DEPTH} levels (arrays, tables, the parts of a "
        "dotted key): a workload file's keys are flat"
    )
    try:
        with open_input(path, where, MAX_FILE_BYTES, gunzip=False) as f:
            text = read_all(f).decode("utf-8")
        if depth(text) > MAX_DEPTH:
            raise deep
        data = tomllib.loads(text)
    except OSError as e:
        raise UsageError(f"{where}: cannot read it: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{where}: not UTF-8 text") from e
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{where}: not valid TOML: {' '.join(str(e).split())}") from e
    except RecursionError:  # what depth() missed: still one line
        raise deep from None
    out: dict[str, Value] = {}
    for raw_key, value in data.items():
        key = ALIASES.get(raw_key, raw_key)
        if key not in _RULES:
            known = ", ".join(sorted({*_RULES, *ALIASES}))
            raise UsageError(f"{where}: unknown key {raw_key!r} (known: {known})")
        if key in out:
            raise UsageError(f"{where}: {raw_key} repeats {key}")
        out[key] = check(key, value, where)
    return out


def depth(text: str) -> int:
    """How deep the TOML in `text` nests, found without parsing it: the brackets and
    braces open outside strings and comments, plus the dots of the key being read (a
    float's one dot counts too, harmlessly)."""
    deepest = level = dots = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            i = _string_end(text, i)
            continue
        if ch == "#":  # a comment, to the end of its line
            i = n if (end := text.find("\n", i)) < 0 else end
            continue
        if ch in "[{":
            level, dots = level + 1, 0
        elif ch in "]}":
            level = max(0, level - 1)
        elif ch == ".":
            dots += 1
        elif ch in "=,\n":
            dots = 0
        deepest = max(deepest, level + dots)
        i += 1
    return deepest


def _string_end(text: str, i: int) -> int:
    """Where the TOML string that starts at text[i] ends (the index after it): basic
    ("...", with backslash escapes) or literal ('...'), on one line or, tripled, on
    several; one not closed ends the text."""
    quote, n = text[i], len(text)
    multi = text.startswith(quote * 3, i)
    j = i + (3 if multi else 1)
    while j < n:
        ch = text[j]
        if ch == "\\" and quote == '"':
            j += 2
        elif multi and text.startswith(quote * 3, j):
            j += 3
            while j < n and text[j] == quote:  # up to two more quotes are the string's
                j += 1
            return j
        elif not multi and (ch == quote or ch == "\n"):
            return j + 1
        else:
            j += 1
    return n


def resolve(from_file: Mapping[str, Value], from_options: Mapping[str, Value]) -> Workload:
    """The defaults, then the file's values, then the options' (already checked)."""
    w = Workload()
    for source, values in (("file", from_file), ("option", from_options)):
        for key, value in values.items():
            w = w.set(key, value, source)
    return w
