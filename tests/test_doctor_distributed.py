"""doctor under torchrun: two ranks on loopback (gloo), one slowed on purpose through
the STARVECHECK_SLOW_RANKS hook; rank 0 alone prints, and names the slowed rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _torchrun(tmp_path: Path, slow: str, *args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("torch.distributed.run")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        STARVECHECK_SLOW_RANKS=slow,
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += ["2", "-m", "starvecheck", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_slowed_rank_is_named_the_straggler(tmp_path):
    # 1 ms of sleep per sample caps rank 1 near 1,000 samples/s per worker; an
    # unslowed loader reads 8 KiB samples from the page cache at tens of thousands.
    p = _torchrun(tmp_path, "1:1", "--quick", "--only", "loader", "--json", "-", str(tmp_path))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)  # rank 0's report alone: rank 1 printed nothing on stdout
    assert [n["rank"] for n in d["nodes"]] == [0, 1]
    fast, slow = d["nodes"]
    assert slow["straggler"] and not fast["straggler"]
    assert slow["data_pipeline_samples_per_s"] < 0.8 * fast["data_pipeline_samples_per_s"]
    (f,) = [f for f in d["checklist"] if f["id"] == "doctor.straggler"]
    assert f["title"].startswith("Rank 1")
    # Rank 0's own stages were not slowed; its loader link is its own figure.
    loader = next(x for x in d["chain"] if x["link"] == "loader")
    assert loader["capacity_samples_per_s"] == fast["capacity_samples_per_s"]["loader"]
    caveats = next(s for s in d["stages"] if s["stage"] == "doctor")["caveats"]
    assert any("ranks 0, 1 measured" in c for c in caveats)
    assert list(tmp_path.iterdir()) == []  # both ranks' scratch data removed


@pytest.mark.slow
def test_bad_hook_is_one_line_and_nothing_is_gathered(tmp_path):
    p = _torchrun(tmp_path, "x", "--only", "pad")
    assert p.returncode != 0
    assert p.stdout == ""
    # Each rank stops with the one line (torchrun may stop the other rank before it
    # prints, then reports the failure with a traceback of its own).
    assert p.stderr.count("starvecheck: error: STARVECHECK_SLOW_RANKS='x': expected") >= 1
