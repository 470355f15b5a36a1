"""The user's pipeline as `--factory` names it: `FILE.py:FUNC` or `package.module:FUNC`,
parsed once where it enters (the command line, or doctor's workload file) into a
`FactorySpec`, which every later step takes as it is. The file is checked before
anything opens it; importing and calling it is the factory stage's
(stages/loader/factory/load.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from starvecheck.core.status import UsageError
from starvecheck.inputs.files import check

# FILE.py:FUNC or package.module:FUNC; FUNC a plain name (no dots: an attribute path
# would run more of the user's code than the one call).
_SPEC = re.compile(r"^(?P<where>[^:]+):(?P<func>[A-Za-z_][A-Za-z0-9_]*)$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# A factory file is Python source: more than this is not one someone wrote by hand.
MAX_SOURCE_BYTES = 16 << 20


@dataclass(frozen=True)
class FactorySpec:
    text: str  # as given
    path: str | None  # FILE.py, or None for a module
    module: str | None  # package.module, or None for a file
    func: str


def parse_spec(text: str) -> FactorySpec:
    """FILE.py:FUNC or package.module:FUNC, or one line saying what is expected."""
    m = _SPEC.match(text.strip()) if text else None
    expected = "give FILE.py:FUNC or package.module:FUNC, FUNC returning a Dataset or DataLoader"
    if m is None:
        raise UsageError(f"--factory {text!r}: {expected}")
    where, func = m.group("where"), m.group("func")
    if where.endswith(".py") or os.sep in where:
        return FactorySpec(text, where, None, func)
    if not _MODULE.match(where):
        raise UsageError(f"--factory {text!r}: {where!r} is neither a .py file nor a module name")
    return FactorySpec(text, None, where, func)


def check_source(path: str) -> None:
    """A regular file of bounded size, checked before anything opens it: a FIFO would
    block the import, a device would be read for ever."""
    check(path, f"--factory {path}", pipes=False)
    size = os.stat(path).st_size
    if size > MAX_SOURCE_BYTES:
        raise UsageError(f"--factory {path}: {size:,} bytes is too large for Python source")
