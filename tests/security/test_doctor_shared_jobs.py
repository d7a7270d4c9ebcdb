"""Two users' batch jobs share a GPU safely, and ``doctor`` says nothing against it.

The daemon packs another user's batch job beside A's (both are held to their budgets;
sched/placement.gpu_users). B's ``doctor`` cannot read A's process environment, where
GPUWARDEN_JOB says the process is a job's: it asks the daemon (/v1/job-pids), so its
``shared_default_mode`` rule, which warns of users sharing a Default-mode GPU with
nothing holding them to a share, stays quiet. Without the daemon's word B sees two
users' processes and warns, as before."""

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


def _shared_findings(doctor: subprocess.CompletedProcess[str]) -> list[int]:
    """The GPUs ``doctor --json`` finds shared in Default mode."""
    findings = json.loads(doctor.stdout)["findings"]
    return [f["gpu"] for f in findings if f["rule"] == "shared_default_mode"]


def doctor_beside_anothers_job(args: dict[str, Any]) -> dict[str, Any]:
    a, b = (pidns.user(u) for u in args["users"])
    tmp = pidns.tmp_home()
    for d in start_daemon(tmp, EXAMPLES / "idle-2gpu.json"):
        jids = []
        for u in (a, b):  # the job registers 1 GiB on GPU 0 (see stdlib_job.JOB)
            r = d.cli(
                "submit", "--cwd", u.home, "--mem", "1G", "--", JOB_PY, "-c", JOB, "60",
                env=pidns.env_of(d.env, u), prefix=u.prefix,
            )  # fmt: skip
            assert r.returncode == 0, r.stderr
            jids.append(int(r.stdout))
        for jid in jids:
            d.wait_state(jid, "running")
        wait_for(
            lambda d=d: len([p for g in d.json("status")["gpus"] for p in g["processes"]]) == 2,
            timeout=30,
            interval=0.1,
            what="both jobs to allocate",
        )
        placed = [d.job(jid)["gpus"] for jid in jids]
        as_b = d.cli("doctor", "--json", env=pidns.env_of(d.env, b), prefix=b.prefix)
        alone = subprocess.run(
            [*b.prefix, PY, "-m", "gpuwarden", "doctor", "--json"],
            env={**pidns.env_of(d.env, b), "GPUWARDEN_HOME": b.home},
            capture_output=True,
            text=True,
            timeout=60,
        )
        for jid in jids:
            d.cli("cancel", str(jid))
        return {
            "placed": placed,
            "with_daemon": _shared_findings(as_b),
            "alone": _shared_findings(alone),
        }
    raise AssertionError("no daemon")


def test_two_users_batch_jobs_share_a_gpu_and_doctor_does_not_warn(
    users: tuple[User, User], pidns_ok: None
) -> None:
    if not os.access(JOB_PY, os.X_OK):
        pytest.skip(f"needs {JOB_PY}")
    out = pidns.run(f"{__name__}:doctor_beside_anothers_job", {"users": pidns.users_args(*users)})
    assert out["placed"] == [[0], [0]], out  # packed: not kept apart by user
    assert out["with_daemon"] == [], out
    assert out["alone"] == [0], out  # what B's doctor said before
