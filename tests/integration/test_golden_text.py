"""The words people read, held still: `status` and `doctor` on each example scenario
against the text in tests/golden/. A change to the wording, a column or a rule's advice
shows up as a diff to review; write the new text with GPUWARDEN_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.helpers.cli import run_in_process
from tests.helpers.paths import EXAMPLES, ROOT

GOLDEN = ROOT / "tests" / "golden"
SCENARIOS = sorted(p.stem for p in EXAMPLES.glob("*.json"))
COMMANDS = {"status": ("status",), "doctor": ("doctor",)}


def _text(out: str) -> str:
    """The output without the spaces rich pads each line with to the width, and with
    the time its samples spanned (which a busy machine stretches) written as ``T``."""
    out = re.sub(r"samples over \d+\.\ds", "samples over Ts", out)
    return "".join(line.rstrip() + "\n" for line in out.splitlines())


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_text_is_the_golden_text(tmp_path: Path, scenario: str, command: str) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUWARDEN_", "CUDA_", "NO_COLOR", "FORCE_COLOR"))
    }
    env.update(
        GPUWARDEN_HOME=str(tmp_path / "home"),  # no daemon to ask
        GPUWARDEN_SIM=str(EXAMPLES / f"{scenario}.json"),
        GPUWARDEN_SIM_STATE=str(tmp_path / "sim"),
        COLUMNS="100",
        TERM="dumb",
    )
    r = run_in_process(env, *COMMANDS[command])
    assert r.stderr == "" and r.returncode in (0, 1), r
    text = f"$ gpuwarden {' '.join(COMMANDS[command])}   # exit {r.returncode}\n" + _text(r.stdout)
    golden = GOLDEN / f"{scenario}.{command}.txt"
    if os.environ.get("GPUWARDEN_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.is_file(), f"no {golden.name}: write it with GPUWARDEN_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"`gpuwarden {command}` on {scenario} no longer prints {golden.name}; if the "
        "change is meant, write the new text with GPUWARDEN_UPDATE_GOLDEN=1 and review "
        "its diff"
    )
