"""Process command lines come from other users (``/proc/PID/cmdline``): ``status`` and
``leaks`` print them with control characters made visible, as ``ps``/``show``/``top``
do with job names (tests/security/test_terminal_escapes.py); ``--json`` stays exact."""

from __future__ import annotations

import json
from typing import Any

from tests.helpers.paths import EXAMPLES

EVIL = "evil\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\rhidden"


def test_status_and_leaks_show_control_characters_escaped(make_sim: Any) -> None:
    scenario = json.loads((EXAMPLES / "a100x8-shared.json").read_text())
    for p in scenario["processes"]:
        p["command"] = EVIL
    sim = make_sim(scenario)
    for verb in (("status",), ("leaks", "--samples", "2", "--interval", "0.1")):
        out = sim.cli(*verb, env={**sim.env, "COLUMNS": "250"})
        assert out.returncode in (0, 1), out.stderr
        for c in ("\x1b", "\x07", "\r"):
            assert c not in out.stdout, f"{verb[0]}: {c!r} reached the terminal"
    assert "evil\\x1b]52;c;" in sim.cli("status", env={**sim.env, "COLUMNS": "250"}).stdout
    raw = sim.json("status")
    assert any(p["command"] == EVIL for g in raw["gpus"] for p in g["processes"])
