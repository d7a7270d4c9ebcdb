"""``leaks`` exits as ``doctor`` does, so cron or a monitor can alert on it: 1 when it
finds a leak, 0 when it finds none (a monitor alone is no leak)."""

from __future__ import annotations

import json
from typing import Any

from tests.helpers.sim import SimMachine


def test_leaks_exits_1_when_it_finds_a_leak_and_0_when_none(sim: SimMachine, make_sim: Any) -> None:
    fast = ("--samples", "2", "--interval", "0.05")
    clean = sim.cli("leaks", *fast)
    assert clean.returncode == 0 and "No leaks" in clean.stdout, clean.stderr
    assert sim.cli("leaks", "--json", *fast).returncode == 0
    leaky = make_sim("leaky-4gpu.json")
    text = leaky.cli("leaks", *fast)
    assert text.returncode == 1 and "dead_pid" in text.stdout, text.stderr
    r = leaky.cli("leaks", "--json", *fast)
    assert r.returncode == 1 and json.loads(r.stdout)["leaks"], r.stderr
    assert "Exit status" in leaky.cli("leaks", "--help").stdout
    assert leaky.cli("leaks", "--threshold", "12X").returncode == 2
