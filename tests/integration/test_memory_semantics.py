"""What ``--mem`` means, carried out by a real daemon over simulated GPUs whose driver
charges every process a CUDA context beside its allocations and frees a dead process's
memory a moment after it leaves the process list (as the real driver does):

- a job that allocates exactly what it declared succeeds, and the driver shows it at its
  budget plus the context; the context is measured from it and booked for later jobs;
- the memory of a job that just ended is its own, never "foreign": a job waiting for it
  starts once it is back, not minutes later."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import EXAMPLES, PY, Daemon, start_daemon

GiB = 1 << 30
MiB = 1 << 20
H100_TOTAL = 85_017_493_504  # torch.cuda.get_device_properties(0).total_memory on an H100


def sim_job(mem: str, seconds: float) -> list[str]:
    return [PY, "-m", "gpuwarden.sim.job", "--mem", mem, "--seconds", str(seconds)]


def _events(job: dict[str, object]) -> dict[str, float]:
    """Event kind -> when it first happened (epoch seconds)."""
    from datetime import datetime

    out: dict[str, float] = {}
    for e in job["events"]:  # type: ignore[attr-defined]
        out.setdefault(e["kind"], datetime.fromisoformat(e["at"]).timestamp())
    return out


def test_a_job_that_allocates_exactly_its_budget_succeeds(daemon: Daemon) -> None:
    first = daemon.submit("--mem", "10G", cmd=sim_job("10G", 2))
    daemon.wait_state(first, "running")
    procs = wait_for(
        lambda: [
            p
            for g in daemon.json("status")["gpus"]
            for p in g["processes"]
            if "gpuwarden.sim.job --mem 10G" in str(p.get("command", ""))
        ],
        timeout=10,
        interval=0.1,
        what="the 10G job's process in status",
    )
    assert procs[0]["memory"] == 10 * GiB + 512 * MiB  # budget + its context
    done = daemon.wait_state(first, "succeeded", "failed", timeout=30)
    assert done["state"] == "succeeded", done
    assert done["oom_retries"] == 0 and not any(e["kind"] == "oom" for e in done["events"])
    assert done["budget"] == 10 * GiB
    assert done["context"] == 704 * MiB  # the default: nothing measured on this GPU yet
    # The job's peak less its allocator's (the report the cap hook writes) measured the
    # simulated GPU's context: the next job books that.
    second = daemon.submit("--mem", "10G", cmd=sim_job("10G", 0))
    assert daemon.wait_state(second, "succeeded", timeout=30)["context"] == 512 * MiB
    shown = daemon.cli("show", str(second), check=True).stdout
    assert "+ 512MiB CUDA context" in shown


@pytest.fixture
def lagging_80g(tmp_path: Path) -> Iterator[Daemon]:
    """One 80 GiB GPU whose driver frees a dead process's memory 300 ms late."""
    scenario = json.loads((EXAMPLES / "one-80g.json").read_text())
    scenario["free_lag"] = 0.3
    path = tmp_path / "lagging-80g.json"
    path.write_text(json.dumps(scenario))
    yield from start_daemon(tmp_path, path)


def test_a_jobs_memory_coming_back_late_is_still_its_own(lagging_80g: Daemon) -> None:
    d = lagging_80g
    first = d.submit("--mem", "40G", cmd=sim_job("40G", 1.5))
    d.wait_state(first, "running")
    big = d.submit("--mem", "70G", cmd=sim_job("1G", 0))
    assert d.job(big)["state"] == "queued"
    ended = d.wait_for_release(first, timeout=30)
    placed = d.wait_state(big, "running", "succeeded", "failed", timeout=30)
    back = _events(ended)["memory_returned"]
    started = _events(placed)["placed"]
    # Within a pass or two (every 100 ms here) of the memory coming back: before, the
    # memory the driver was still freeing was kept as a foreign peak for five minutes.
    assert started - back < 1.5, (ended["events"], placed["events"])
    assert d.wait_state(big, "succeeded", "failed", timeout=30)["state"] == "succeeded"


@pytest.fixture
def h100_sized(tmp_path: Path) -> Iterator[Daemon]:
    """One GPU of an H100's CUDA total, where ``25 GiB / total`` as PyTorch's memory
    fraction gives its allocator one byte less than 25 GiB."""
    scenario = json.loads((EXAMPLES / "one-80g.json").read_text())
    scenario["gpus"][0]["memory_total"] = H100_TOTAL
    path = tmp_path / "h100-sized.json"
    path.write_text(json.dumps(scenario))
    yield from start_daemon(tmp_path, path)


def test_a_budget_the_fraction_would_round_down_is_still_held_in_full(h100_sized: Daemon) -> None:
    # The simulated torch rounds the hook's fraction as PyTorch does, so a cap a byte
    # short of the budget fails this job with an OOM at its cap, as it did on an H100.
    jid = h100_sized.submit("--mem", "25G", cmd=sim_job("25G", 0))
    done = h100_sized.wait_state(jid, "succeeded", "failed", timeout=30)
    assert done["state"] == "succeeded" and done["oom_retries"] == 0, done["events"]


def _samples(d: Daemon) -> list[int]:
    """The CUDA contexts the daemon kept as measured (its real SQLite state file)."""
    with contextlib.closing(sqlite3.connect(d.home / "state.db")) as db:
        return [b for (b,) in db.execute("SELECT bytes FROM contexts ORDER BY at")]


def test_only_an_attempt_that_succeeded_measures_the_context(daemon: Daemon) -> None:
    # An attempt that fails early (an OOM at its first allocations) has not loaded its
    # kernels: on a GPU its context shows less than its work takes, so it is no sample.
    failed = daemon.submit(
        "--mem",
        "1G",
        "--retries",
        "0",
        cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "1G", "--grow-to", "3G", "--seconds", "2"],
    )  # holds 1 GiB (and its context) for a second, then asks for more than its cap
    done = daemon.wait_state(failed, "succeeded", "failed", timeout=30)
    assert done["state"] == "failed"
    # The daemon saw its peak and read its allocator's: it could have been measured.
    assert done["peak_memory"] == GiB + 512 * MiB and done["allocated_peak"] == GiB
    assert _samples(daemon) == []
    ok = daemon.submit("--mem", "1G", cmd=sim_job("1G", 1))
    assert daemon.wait_state(ok, "succeeded", "failed", timeout=30)["state"] == "succeeded"
    assert _samples(daemon) == [512 * MiB]
