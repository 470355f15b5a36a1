"""Give a CPU-only torch the torchvision made for it, without the compiled ops that
cannot load beside it.

    python scripts/torchvision_cpu.py      # with the venv's python, after torch

Why (the one place this is explained; the Makefile runs it, constraints.txt pins the
pair): this project's set-up installs the CPU build of torch 2.13.0 that this kind of
machine carries. The torchvision made for torch 2.13.0 (0.28.0) is published only as a
CUDA build: its compiled parts (`_C.so`, `image.so`) link libtorch_cuda and libc10_cuda,
which a CPU torch does not have, so they cannot load. torchvision handles that (its ops
then raise "Couldn't load custom C++ ops" when called), except for two fake-kernel
registrations that run unguarded at import and fail with `RuntimeError: operator
torchvision::nms does not exist`; transformers' Trainer, Lightning (through torchmetrics)
and `import streaming` all import torchvision, so all three failed.

What this does, only when the installed torch is a CPU build (with a CUDA torch, PyPI's
torchvision matches it and nothing is done):
1. downloads the torchvision wheel pinned in constraints.txt (about 8 MB; pip checks its
   hash against the index);
2. rebuilds it as `torchvision-<version>+noops`, pure Python: without `_C.so`,
   `image.so` and the CUDA libraries in `torchvision.libs/`, and with the two
   registrations guarded as pytorch/vision#9649 proposes (`_has_ops()`, as the
   `register_meta` helper beside them already is);
3. installs it with --no-deps into the running interpreter's environment.

What works with it: everything in Python (transforms v1 and v2, datasets, models,
`VisionDataset`, `to_tensor`, PIL decoding). What does not: torchvision's C++ ops
(`torchvision.ops.nms`, `roi_align`, `deform_conv2d`, ...), `torchvision.io`'s
decode_jpeg/encode_png and the video reader: they raise torchvision's own error, as in
any torchvision whose extension did not load. starvecheck uses none of them.

Cost (this machine, 2 cores): about 3 s and 5 MB installed, against 21 MB for the CUDA
wheel's files; the alternative pair that imports whole here, torch 2.14.1 with
torchvision 0.29.1, is a CUDA build of 5.5 GB.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
LOCAL = "noops"  # the local version label of the rebuilt wheel
DROP = re.compile(r"^(torchvision/[^/]+\.so|torchvision\.libs/.*)$")
GUARD = """

def _register_fake_if_ops(name):
    # Built by starvecheck's scripts/torchvision_cpu.py: the compiled ops were left out,
    # so there is no op to give a fake kernel (the guard pytorch/vision#9649 proposes).
    if torchvision.extension._has_ops():
        return torch.library.register_fake(name)
    return lambda fn: fn
"""


def fail(message: str) -> None:
    sys.exit(f"torchvision_cpu: {message}")


def pinned_version() -> str:
    for line in CONSTRAINTS.read_text().splitlines():
        m = re.fullmatch(r"\s*torchvision\s*==\s*([\w.]+)\s*(#.*)?", line)
        if m:
            return m.group(1)
    fail(f"{CONSTRAINTS} pins no torchvision (a line `torchvision==X.Y.Z`)")
    raise AssertionError  # unreachable


def installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        return None


def patch_meta(text: str) -> str:
    """Guard the fake-kernel registrations that need the compiled ops."""
    names = re.findall(r'@torch\.library\.register_fake\("(torchvision::\w+)"\)', text)
    if not names:
        fail("_meta_registrations.py has no register_fake to guard: check this torchvision")
    text = re.sub(r"@torch\.library\.register_fake\(", "@_register_fake_if_ops(", text)
    anchor = text.find("\n\n@register_meta(")
    if anchor < 0:
        fail("_meta_registrations.py has no register_meta: check this torchvision")
    return text[:anchor] + GUARD + text[anchor:]


def rebuild(wheel: Path, out: Path, version: str) -> Path:
    """The wheel's Python files, renamed to `version`, ready to install."""
    new = f"{version}+{LOCAL}"
    old_info = f"torchvision-{version}.dist-info/"
    new_info = f"torchvision-{new}.dist-info/"
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if DROP.match(name) or name == old_info + "RECORD" or name.endswith("/"):
                continue
            data = z.read(name)
            if name == "torchvision/_meta_registrations.py":
                data = patch_meta(data.decode()).encode()
            elif name == "torchvision/version.py":
                data = re.sub(rb"__version__ = '[^']*'", f"__version__ = '{new}'".encode(), data)
            elif name == old_info + "METADATA":
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {new}".encode(), data)
            elif name == old_info + "WHEEL":
                text = re.sub(r"(?m)^Root-Is-Purelib: .*$", "Root-Is-Purelib: true", data.decode())
                text = re.sub(r"(?m)^Tag: .*\n?", "", text).rstrip("\n") + "\nTag: py3-none-any\n"
                data = text.encode()
            files[name.replace(old_info, new_info, 1)] = data
    if f"{new_info}METADATA" not in files:
        fail(f"{wheel.name} has no {old_info}METADATA")
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
    writer.writerow([new_info + "RECORD", "", ""])
    files[new_info + "RECORD"] = record.getvalue().encode()
    target = out / f"torchvision-{new}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return target


def pip(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"pip {' '.join(args)} failed: {(r.stderr or r.stdout).strip()[-1500:]}")


def main() -> None:
    try:
        import torch
    except ImportError:
        fail("install torch first (the Makefile does: constraints.txt pins it)")
    version = pinned_version()
    if torch.version.cuda is not None:
        print(
            f"torchvision_cpu: torch {torch.__version__} is a CUDA build; PyPI's "
            f"torchvision {version} matches it, nothing to do"
        )
        return
    if installed_version() == f"{version}+{LOCAL}":
        print(f"torchvision_cpu: torchvision {version}+{LOCAL} is installed")
        return
    with tempfile.TemporaryDirectory(prefix="torchvision-cpu-") as tmp:
        work = Path(tmp)
        pip(
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--dest",
            str(work / "in"),
            f"torchvision=={version}",
        )
        (wheel,) = (work / "in").glob("torchvision-*.whl")
        (work / "out").mkdir()
        built = rebuild(wheel, work / "out", version)
        pip("install", "--quiet", "--no-deps", "--force-reinstall", str(built))
    print(
        f"torchvision_cpu: installed torchvision {version}+{LOCAL} (pure Python, no "
        f"compiled ops) beside torch {torch.__version__}"
    )


if __name__ == "__main__":
    main()
