"""Backfill without run times, on a real daemon over one simulated 80 GiB GPU: a job that
fits starts while the first waiting job's start is unknown, until that job has waited
``starve_after``; then its room is held."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import PY, Daemon, start_daemon

GUARD = 2.0  # starve_after, seconds


@pytest.fixture
def one_gpu(tmp_path: Path) -> Iterator[Daemon]:
    yield from start_daemon(tmp_path, EXAMPLES / "one-80g.json", f'starve_after = "{GUARD:g}s"\n')


def sim(mem: str, seconds: float) -> list[str]:
    """A simulated job allocating ``mem`` (a little under what it declares)."""
    return [PY, "-m", "gpuwarden.sim.job", "--mem", mem, "--seconds", str(seconds)]


def test_a_job_that_fits_starts_until_the_guard_then_the_first_job_keeps_its_room(
    one_gpu: Daemon,
) -> None:
    d = one_gpu
    running = d.submit("--mem", "40G", cmd=sim("39G", 120))
    d.wait_state(running, "running")
    head = d.submit("--mem", "60G", cmd=sim("59G", 1))
    submitted = time.monotonic()
    # No timeout anywhere: the 60G job's start is unknown; a 30G that fits starts at once.
    fill = d.submit("--mem", "30G", "--name", "fill", cmd=sim("29G", 1))
    d.wait_state(fill, "running", "succeeded", timeout=10)
    j = d.wait_reason(head, "jobs that fit start before it")
    assert j["estimate"]["seconds"] is None and j["estimate"]["how"].startswith("unknown")
    d.wait_state(fill, "succeeded", timeout=30)
    d.wait_for_release(fill)
    time.sleep(max(0.0, GUARD + 0.5 - (time.monotonic() - submitted)))
    # The guard has passed: a new 30G fits now but would take the 60G job's room.
    late = d.submit("--mem", "30G", "--name", "fill", cmd=sim("29G", 1))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        j = d.job(late)
        assert j["state"] == "queued", j
        time.sleep(0.2)
    assert f"would delay job {head}" in j["reason"] and "its room is held" in j["reason"]
    assert j["estimate"]["how"].startswith("learned: "), j["estimate"]  # from the first fill
    assert 0 < j["estimate"]["seconds"] < 30
    assert "its room is held" in d.job(head)["reason"]
    # The 40G job ends: the 60G one starts first; the 30G waits for room beside it.
    d.cli("cancel", str(running), check=True)
    d.wait_state(head, "running", "succeeded", timeout=30)
    assert d.job(late)["state"] == "queued"
    d.wait_state(late, "succeeded", timeout=60)
    assert d.job(head)["state"] == "succeeded"
