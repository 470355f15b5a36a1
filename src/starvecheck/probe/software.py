"""Versions of Python and the ML libraries, read without importing them.

Importing torch takes seconds; `env` must feel instant. Versions come from the
names of the installed distributions' `.dist-info` directories (PEP 427 names them
`{name}-{version}.dist-info`), which takes a directory listing per sys.path entry;
importlib.metadata, which opens and email-parses each METADATA file, is the
fallback and costs ~50 ms more. torch's CUDA build is a constant in
torch/version.py, which we read as text.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import util
from pathlib import Path

from starvecheck.probe.fact import Fact

PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "streaming": "mosaicml-streaming",
    "numpy": "numpy",
    "nvidia_ml_py": "nvidia-ml-py",
}


@dataclass(frozen=True)
class SoftwareFacts:
    python: str
    versions: dict[str, Fact[str]]
    torch_cuda: Fact[str]  # the CUDA version torch was built for; absent for a CPU build


def _normalise(name: str) -> str:
    # PEP 503 normalisation; wheel directory names use "_" where the project has "-".
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_versions(paths: Iterable[str]) -> dict[str, str]:
    """{normalised name: version} from `.dist-info` directory names, first on the path wins."""
    found: dict[str, str] = {}
    for entry in paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            dist, sep, version = name[: -len(".dist-info")].partition("-")
            if sep and version:
                found.setdefault(_normalise(dist), version)
    return found


def package_version(dist: str, installed: dict[str, str] | None = None) -> Fact[str]:
    installed = installed_versions(sys.path) if installed is None else installed
    version = installed.get(_normalise(dist))
    if version:
        return Fact.of(version)
    # Not found as a wheel-style install (an .egg-info develop install, a zip):
    # ask importlib.metadata, which knows every kind.
    from importlib import metadata

    try:
        return Fact.of(metadata.version(dist))
    except metadata.PackageNotFoundError:
        return Fact.absent(f"{dist} is not installed")
    except Exception as e:  # a broken dist-info must not break env
        return Fact.unknown(f"cannot read {dist} metadata: {e}")


def parse_torch_version_py(text: str) -> str | bool | None:
    """The `cuda` constant of torch/version.py: "12.4", None (CPU build), or False if absent."""
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*(.+)$", text, re.MULTILINE)
    if not m:
        return False
    value = m.group(1).strip()
    if value == "None":
        return None
    s = re.fullmatch(r"""(['"])([^'"]+)\1""", value)
    return s.group(2) if s else False


def torch_cuda_build() -> Fact[str]:
    try:
        spec = util.find_spec("torch")  # locates the package without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return Fact.absent("torch is not installed")
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError as e:
        return Fact.unknown(f"cannot read torch/version.py: {e.strerror}")
    cuda = parse_torch_version_py(text)
    if cuda is False:
        return Fact.unknown("torch/version.py has no cuda constant")
    if cuda is None:
        return Fact.absent("torch is a CPU-only build")
    return Fact.of(str(cuda))


def probe_software() -> SoftwareFacts:
    installed = installed_versions(sys.path)
    return SoftwareFacts(
        python=platform.python_version(),
        versions={key: package_version(dist, installed) for key, dist in PACKAGES.items()},
        torch_cuda=torch_cuda_build(),
    )
