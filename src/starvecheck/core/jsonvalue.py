"""What JSON holds, as a type: what `json.loads` gives and every `to_dict` writes. A
stored report read back is this, not `Any`: a reader checks what it takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = Mapping[str, JsonValue]  # one object, as read
JsonDict: TypeAlias = dict[str, JsonValue]  # one object, as written
