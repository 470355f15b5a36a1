"""Renderers against stored reports: exact output, as hyperfine's tests compare tables.

tests/golden/<machine>.json are reports of the fake machines, stored once; the
terminal and Markdown renderings of each are compared byte for byte. After an
intended change of output, regenerate with:  UPDATE_GOLDEN=1 pytest tests/test_render.py
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from starvecheck.context import Context
from starvecheck.model import Report
from starvecheck.render import json as json_export
from starvecheck.render import markdown
from starvecheck.render.terminal import render
from tests.conftest import run, sysroot_env

GOLDEN = Path(__file__).parent / "golden"
MACHINES = ["docker-v1-shm64", "k8s-pod-v2", "baremetal-numa-8gpu", "vm-no-numa-no-gpu"]
UPDATE = bool(os.environ.get("UPDATE_GOLDEN"))


def stored_report(name: str) -> Report:
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        r = run("env", "--json", "-", env=sysroot_env(name))
        data = r.json
        # Keep the stored report independent of where the repository lies.
        data["machine"]["sysroot"] = f"tests/fixtures/sysroots/{name}"
        data["stages"][0]["parameters"]["sysroot"] = data["machine"]["sysroot"]
        data["stages"][0]["caveats"] = [
            c.replace(str(Path.cwd()) + "/", "") for c in data["stages"][0]["caveats"]
        ]
        data["stages"][0]["duration_s"] = 0.01
        path.write_text(json.dumps(data, indent=2) + "\n")
    return Report.from_dict(json.loads(path.read_text()))


def terminal_text(report: Report) -> str:
    out = io.StringIO()
    console = Context(stdout=out, stdout_isatty=False, width=100, environ={}).console()
    render(report, console)
    return "\n".join(line.rstrip() for line in out.getvalue().split("\n"))


def check(path: Path, text: str) -> None:
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("name", MACHINES)
def test_terminal_rendering(name):
    check(GOLDEN / f"{name}.txt", terminal_text(stored_report(name)))


@pytest.mark.parametrize("name", MACHINES)
def test_markdown_rendering(name):
    check(GOLDEN / f"{name}.md", markdown.serialize(stored_report(name)))


@pytest.mark.parametrize("name", MACHINES)
def test_json_export_round_trips_the_stored_report(name):
    report = stored_report(name)
    assert Report.from_dict(json.loads(json_export.serialize(report))) == report


def test_markdown_escapes_table_cells():
    report = Report.from_dict(json.loads((GOLDEN / "k8s-pod-v2.json").read_text()))
    text = markdown.serialize(report)
    for line in text.splitlines():
        if line.startswith("|"):
            cells = line.replace("\\|", "").count("|")
            assert cells == line.split("\n")[0].replace("\\|", "").count("|")


def test_terminal_shows_the_gpu_table_and_the_ranked_order():
    text = terminal_text(stored_report("baremetal-numa-8gpu"))
    assert "0000:ba:00.0" in text and "gen1 x8" in text and "63.0" in text
    assert "0000:ab:00.0" in text  # not an emoji: the console reads no markup
    # Warnings come before the info note in the checklist.
    assert text.index("[env.numa-remote-gpu]") < text.index("[env.pcie-gen-below-max]")
