"""``gpuwarden edit`` on a real daemon over the simulated 2 x 24 GiB machine: a queued
job's new request changes where (and whether) it is placed; the bounds, [limits] and
"can never run here" of submit refuse an edit as they refuse a submission; only the owner
or an admin may edit, and only a queued or held job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.units import GiB
from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon, start_daemon

SIM = [PY, "-m", "gpuwarden.sim.job"]
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose users (not admins) may ask for priority at most 0."""
    yield from start_daemon(
        tmp_path, EXAMPLES / "idle-2gpu.json", config="[limits]\nmax_priority = 0\n"
    )


def _one_line(r: subprocess.CompletedProcess[str], code: int, said: str) -> None:
    assert r.returncode == code and len(r.stderr.splitlines()) == 1, (r.returncode, r.stderr)
    assert said in r.stderr, r.stderr


def test_edit_changes_placement_and_submit_bounds_refuse(limited: Daemon) -> None:
    daemon = limited
    blockers = [
        daemon.submit(
            "--mem", "18G", "--gpu-ids", str(i), cmd=[*SIM, "--mem", "1G", "--seconds", "60"]
        )
        for i in (0, 1)
    ]
    for jid in blockers:
        daemon.wait_state(jid, "running")
    big = daemon.submit(
        "--mem", "10G", "--name", "eval", cmd=[*SIM, "--mem", "1G", "--seconds", "0"]
    )
    wait_for(
        lambda: daemon.job(big),
        20,
        0.1,
        until=lambda j: "waiting for 10.0GiB free" in (j["reason"] or ""),
        what=str,
    )
    time.sleep(0.5)
    assert daemon.job(big)["state"] == "queued"  # no GPU has 10G: it waits

    # Bounds and rules of submit, before anything is written.
    for args, code, said in (
        (("--priority", "5000"), 2, "priority must be between -1000 and 1000"),
        (("--gpus", "3"), 2, "this job can never run here: needs 3 GPUs"),
        (("--mem", "100G"), 2, "this job can never run here"),
        (("--mem-limit", "1G"), 2, "mem_limit must be at least mem"),
        (("--mem", "nonsense"), 2, "mem:"),
        ((), 2, "name what to change"),
    ):
        _one_line(daemon.cli("edit", str(big), *args), code, said)
    j = daemon.job(big)
    assert (j["mem"], j["priority"], j["gpu_count"]) == (10 * GiB, 0, 1)
    assert "edited" not in [e["kind"] for e in j["events"]]

    r = daemon.cli("edit", str(big), "--mem", "2G", "--name", "eval-small", check=True)
    assert (
        f"job {big} edited by root: mem 10.0GiB -> 2048MiB, name eval -> eval-small" in r.stdout
    ), r.stdout
    daemon.cli("wait", str(big), timeout=60)
    j = daemon.job(big)
    assert j["state"] == "succeeded" and j["budget"] == 2 * GiB, j
    assert j["name"] == "eval-small" and j["gpus"] in ([0], [1])
    _one_line(
        daemon.cli("edit", str(big), "--priority", "1"),
        2,
        f"job {big} is succeeded; only a queued or held job can be edited",
    )
    _one_line(daemon.cli("edit", str(blockers[0]), "--priority", "1"), 2, "is running")
    _one_line(daemon.cli("edit", "999999", "--priority", "1"), 2, "999999")

    # A held job: edited, then released with its new request.
    held = daemon.submit("--mem", "8G", "--gpu-ids", "0", cmd=[*SIM, "--seconds", "0"])
    daemon.cli("hold", str(held), check=True)  # it cannot fit beside the blocker yet
    out = json.loads(
        daemon.cli(
            "edit",
            str(held),
            "--gpus",
            "1",
            "--qos",
            "guaranteed",
            "--priority",
            "7",
            "--timeout",
            "10m",
            "--json",
            check=True,
        ).stdout
    )
    assert (out["state"], out["qos"], out["priority"], out["timeout"]) == (
        "held",
        "guaranteed",
        7,
        600.0,
    )
    daemon.cli("cancel", "--kill", *map(str, blockers), check=True)
    daemon.cli("release", str(held), check=True)
    daemon.cli("wait", str(held), timeout=60)
    assert daemon.job(held)["state"] == "succeeded"


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and setpriv to act as another user",
)
def test_only_the_owner_or_an_admin_may_edit_within_the_limits(limited: Daemon) -> None:
    daemon = limited
    env = {**daemon.env, "HOME": "/tmp"}
    probe = subprocess.run(
        [*NOBODY, PY, "-c", "import gpuwarden"], env=env, capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip(f"another user cannot run this test's Python: {probe.stderr}")
    first = daemon.submit("--mem", "1G", cmd=[*SIM, "--seconds", "30"])
    daemon.wait_state(first, "running")
    theirs = int(
        daemon.cli(
            "submit",
            "--mem",
            "1G",
            "--after",
            str(first),
            "--",
            "true",
            env=env,
            prefix=NOBODY,
            check=True,
        ).stdout.strip()
    )
    mine = daemon.submit("--mem", "1G", "--after", str(first), cmd=[*SIM, "--seconds", "0"])
    # Their own job, within the limits: yes; past [limits] max_priority: no.
    daemon.cli("edit", str(theirs), "--priority", "-3", env=env, prefix=NOBODY, check=True)
    _one_line(
        daemon.cli("edit", str(theirs), "--priority", "5", env=env, prefix=NOBODY),
        4,
        "may ask for priority at most 0 ([limits] max_priority)",
    )
    # Another user's job: no.
    _one_line(
        daemon.cli("edit", str(mine), "--priority", "-1", env=env, prefix=NOBODY),
        4,
        f"job {mine} belongs to root; only its owner or an admin may edit it",
    )
    # An admin (root) may edit anyone's, past the limits too.
    daemon.cli("edit", str(theirs), "--priority", "5", check=True)
    assert daemon.job(theirs)["priority"] == 5 and daemon.job(mine)["priority"] == 0
    daemon.cli("cancel", str(first), str(theirs), str(mine), check=True)
