"""A group held after a failure streak holds what is submitted to it afterwards too, and
says so at submit; a release lets the group run again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.daemon_fixture import EXAMPLES, PY, Daemon, start_daemon

FAIL = [PY, "-c", "import sys; sys.exit(3)"]
OK = [PY, "-c", "pass"]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Daemon]:
    yield from start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json")


def test_submission_to_a_held_group_is_held_and_says_so(node: Daemon) -> None:
    for _ in range(3):
        jid = node.submit("--group", "sweep", "--no-requeue", cmd=FAIL)
        node.wait_state(jid, "failed")
    r = node.cli("submit", "--group", "sweep", "--json", "--", *OK, check=True)
    job = json.loads(r.stdout)
    assert job["state"] == "held", job
    assert "held until released" in (job["group_held"] or "")
    plain = node.cli("submit", "--group", "sweep", "--", *OK, check=True)
    assert "held" in plain.stderr and "release" in plain.stderr
    # Another group is not held.
    other = node.submit("--group", "other", cmd=OK)
    node.wait_state(other, "succeeded")
    # Released, the job runs; after a release the group takes new jobs again.
    node.cli("release", str(job["id"]), check=True)
    node.wait_state(job["id"], "succeeded")
    later = node.submit("--group", "sweep", cmd=OK)
    node.wait_state(later, "succeeded")
