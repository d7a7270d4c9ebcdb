"""Another user's ``status`` names the job of A's job processes.

B cannot read A's process environment, where GPUWARDEN_JOB says which job a process is
part of; ``ps`` shows B every job already, so ``status`` asks the root daemon for the job
of each pid (/v1/job-pids) and names it, as it does for B's own."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, start_daemon
from tests.security import pidns
from tests.security.pidns import User
from tests.security.stdlib_job import JOB, JOB_PY


def status_of_anothers_job(args: dict[str, Any]) -> dict[str, Any]:
    a, b = (pidns.user(u) for u in args["users"])
    tmp = pidns.tmp_home()
    for d in start_daemon(tmp, EXAMPLES / "idle-2gpu.json"):
        r = d.cli(
            "submit",
            "--cwd",
            a.home,
            "--mem",
            "1G",
            "--",
            JOB_PY,
            "-c",
            JOB,
            "60",
            env=pidns.env_of(d.env, a),
            prefix=a.prefix,
        )
        assert r.returncode == 0, r.stderr
        jid = int(r.stdout)
        d.wait_state(jid, "running")
        wait_for(
            lambda d=d: [p for g in d.json("status")["gpus"] for p in g["processes"]],
            timeout=30,
            interval=0.1,
            what="the job to allocate",
        )
        as_b = d.cli("status", "--json", env=pidns.env_of(d.env, b), prefix=b.prefix)
        assert as_b.returncode == 0, as_b.stderr
        procs = [p for g in json.loads(as_b.stdout)["gpus"] for p in g["processes"]]
        # Without the daemon (its socket gone for B), the environment is all there is.
        alone = subprocess.run(
            [*b.prefix, PY, "-m", "gpuwarden", "status", "--json"],
            env={**pidns.env_of(d.env, b), "GPUWARDEN_HOME": b.home},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert alone.returncode == 0, alone.stderr
        unaided = [p for g in json.loads(alone.stdout)["gpus"] for p in g["processes"]]
        d.cli("cancel", str(jid))
        return {
            "jid": jid,
            "user": a.name,
            "procs": [[p["user"], p["job"]] for p in procs],
            "unaided": [[p["user"], p["job"]] for p in unaided],
        }
    raise AssertionError("no daemon")


def test_another_users_status_names_the_job_of_each_job_process(
    users: tuple[User, User], pidns_ok: None
) -> None:
    if not os.access(JOB_PY, os.X_OK):
        pytest.skip(f"needs {JOB_PY}")
    out = pidns.run(f"{__name__}:status_of_anothers_job", {"users": pidns.users_args(*users)})
    assert out["procs"] == [[out["user"], str(out["jid"])]], out
    assert out["unaided"] == [[out["user"], None]], out  # what B saw before
