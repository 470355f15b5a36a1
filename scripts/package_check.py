"""Build starvecheck's wheel and sdist, install the wheel into a fresh virtual
environment, and run it there: a packaging mistake (a module left out, a dependency
not declared, an upper bound that would downgrade a user's torch) fails here, in CI,
not on a user's GPU node.

    python scripts/package_check.py [--keep]

The fresh environment gets the CPU torch from constraints.txt (as `make` does), so
nothing pulls a CUDA build; everything else resolves as a user's `pip install` would.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sh(*argv: str | Path, cwd: Path | None = None) -> str:
    print("+", " ".join(map(str, argv)), flush=True)
    r = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def check_bounds(reqs: list[str]) -> None:
    """No upper bound on torch (a user's CUDA build must stay); tomli where tomllib is
    missing."""
    torch = [r for r in reqs if re.match(r"torch\b", r)]
    if not torch or any("<" in r for r in torch):
        sys.exit(f"torch must be required without an upper bound, found {torch}")
    if not any(r.startswith("tomli") and "python_version" in r for r in reqs):
        sys.exit(f"tomli must be required on Python before 3.11, found {reqs}")
    print("requirements:", "; ".join(reqs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="keep the build and the environment")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="starvecheck-package-"))
    try:
        dist = work / "dist"
        sh(sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", dist, ROOT)
        (wheel,) = dist.glob("*.whl")
        (sdist,) = dist.glob("*.tar.gz")
        check_bounds(requirements(wheel))
        # The sdist holds the sources the wheel was built from.
        names = sh("tar", "tzf", sdist)
        for needed in ("src/starvecheck/cli/main.py", "README.md", "pyproject.toml"):
            if needed not in names:
                sys.exit(f"{sdist.name} lacks {needed}")
        venv = work / "venv"
        sh(sys.executable, "-m", "venv", venv)
        pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet"]
        sh(*pip, "--constraint", ROOT / "constraints.txt", f"{wheel}[text]")
        exe = venv / "bin" / "starvecheck"
        run_dir = work / "run"
        run_dir.mkdir()
        print(sh(exe, "--version", cwd=run_dir).strip())
        sh(exe, "env", "--json", "-", cwd=run_dir)
        sh(exe, "pad", "--quick", "--json", "-", cwd=run_dir)
        print("package check: wheel and sdist build; the wheel installs and runs")
    finally:
        if args.keep:
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
