"""``cancel 1-100000`` and ``cancel --group`` are one request (POST /v1/cancel), not
one per id: a range of 100,000 ids that name three jobs ends at once."""

from __future__ import annotations

import json
import time

import pytest

from gpuwarden.errors import UsageError
from tests.integration.daemon_fixture import PY, Daemon

SLEEP = [PY, "-m", "gpuwarden.sim.job", "--seconds", "60"]


def test_a_huge_range_and_a_group_are_one_request_each(daemon: Daemon) -> None:
    done = daemon.submit("--mem", "1G")
    daemon.wait_state(done, "succeeded")
    blocker = daemon.submit("--mem", "1G", cmd=SLEEP)
    a = daemon.submit("--mem", "1G", "--after", str(blocker), "--group", "g")
    b = daemon.submit("--mem", "1G", "--after", str(blocker), "--group", "g")
    other = daemon.submit("--mem", "1G", "--after", str(blocker), "--group", "h")

    r = daemon.cli("cancel", "--group", "g")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"job {a} cancelled", f"job {b} cancelled"]
    assert daemon.job(other)["state"] == "queued"
    r = daemon.cli("cancel", "--group", "nosuch")
    assert r.returncode == 2
    assert (
        r.stderr.strip() == "gpuwarden: error: no waiting or running job of yours in group 'nosuch'"
    )

    started = time.monotonic()
    r = daemon.cli("cancel", "1-100000", timeout=60)
    took = time.monotonic() - started
    assert took < 10, f"cancel 1-100000 took {took:.1f}s"  # one request per id: > 20 s
    assert r.returncode == 2
    assert f"job {other} cancelled" in r.stdout
    assert f"job {blocker}: stopping" in r.stdout
    errors = r.stderr.splitlines()
    assert f"gpuwarden: error: job {done} is already succeeded" in errors
    assert f"gpuwarden: error: no job {other + 1}-100000" in errors  # once, folded
    assert len(errors) == 4, errors  # done, a and b (cancelled already), the missing ids
    daemon.wait_state(blocker, "cancelled")

    r = daemon.cli("cancel", str(done), "99999", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 2 and out["jobs"] == [] and out["missing"] == [99999]
    assert [e["id"] for e in out["errors"]] == [done]


def test_a_field_given_must_hold_what_the_document_says(daemon: Daemon) -> None:
    """null is no list: a body the OpenAPI document refuses is a 400, not "nothing named";
    an empty list names no job, as ``cancel --group`` sends it."""
    job = daemon.submit("--mem", "1G", "--group", "g", cmd=SLEEP)
    for body, says in (
        ({"ids": [job], "refs": None}, "refs must be a list"),
        ({"refs": [str(job)], "ids": None}, "ids must be a list"),
        ({"ids": [job], "refs": ""}, "refs must be a list"),
        ({"ids": [job], "kill": None}, "kill must be true or false"),
        ({"ids": [], "refs": []}, "name job ids or a group"),
    ):
        with pytest.raises(UsageError, match=says):
            daemon.api("POST", "/v1/cancel", body=body)
    assert daemon.job(job)["state"] in ("queued", "reserved", "running")  # none cancelled it
    out = daemon.api("POST", "/v1/cancel", body={"refs": [], "ids": [], "group": "g"})
    assert [j["id"] for j in out["jobs"]] == [job], out
