"""The examples `loader --factory` is shown on, run as a user would: the JPEG images in
MosaicML Streaming's MDS shards (Streaming's shared memory released after), and the
JSONL documents tokenized on the fly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import settled

ROOT = Path(__file__).resolve().parent.parent
COMMAND = (sys.executable, "-m", "starvecheck", "loader", "--factory")


def factory(spec: str, tmp_path: Path, **env: str) -> dict:
    out = subprocess.run(
        [*COMMAND, spec, "--quick", "--budget", "2", "--json", "-"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "STARVECHECK_EXAMPLE_DIR": str(tmp_path), **env},
    )
    assert out.returncode in (0, 1), out.stderr[-2000:]
    (stage,) = json.loads(out.stdout)["stages"]
    return stage


def shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


@pytest.mark.slow
def test_the_mds_example_is_measured_and_leaves_no_shared_memory(tmp_path: Path) -> None:
    pytest.importorskip("streaming")
    before = shm()
    stage = factory(
        f"{ROOT / 'examples' / 'jpeg_pipeline.py'}:mds", tmp_path, STARVECHECK_EXAMPLE_IMAGES="96"
    )
    assert (tmp_path / "starvecheck-example-jpeg-96-mds" / "index.json").is_file()
    rates = [m["value"] for m in stage["metrics"] if m["labels"].get("quantity") == "samples_per_s"]
    assert rates and all(r and r > 0 for r in rates)
    assert any(f["id"] == "loader.own-config" for f in stage["findings"])
    # Streaming's blocks for the example's prefix are released when the run ends.
    streaming = lambda: {n for n in shm() - before if n[:6].isdigit() and n[6:7] == "_"}  # noqa: E731
    assert not settled(streaming)


@pytest.mark.slow
def test_the_jsonl_example_is_measured(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    stage = factory(f"{ROOT / 'examples' / 'jsonl_tokenized.py'}:jsonl", tmp_path)
    own = [f for f in stage["findings"] if f["id"] == "loader.own-config"]
    assert own and stage["parameters"]["configurations"]
