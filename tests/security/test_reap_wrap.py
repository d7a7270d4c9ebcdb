"""Leak reaping signals only the processes recorded for the ended attempt.

A's job leaves GPU memory charged to its pid P after it ends (a context the driver did
not free). Within ``release_timeout`` pid P comes round again, to B's detached worker.
When the daemon (root) reaps what the attempt left, it must see that P is now another
process — its start time is not the one recorded — and leave it alone."""

from __future__ import annotations

import json
import time
from typing import Any

import psutil

from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import start_daemon
from tests.security import pidns
from tests.security.pidns import User


def reused_leak_pid(args: dict[str, Any]) -> dict[str, Any]:
    """Inside the namespace: A's leaking job, then B's worker on its pid, then the reap."""
    a, b = (pidns.user(u) for u in args["users"])
    tmp = pidns.tmp_home()
    for d in start_daemon(tmp, EXAMPLES / "idle-2gpu.json", 'release_timeout = "3s"\n'):
        env = pidns.env_of(d.env, a)
        r = d.cli(
            "submit", "--cwd", a.home, "--mem", "2G", "--", "sleep", "2", env=env, prefix=a.prefix
        )
        assert r.returncode == 0, r.stderr
        jid = int(r.stdout)
        job = d.wait_state(jid, "running")
        [proc] = [
            p
            for p in psutil.process_iter(["uids", "cmdline"])
            if p.info["uids"].real == a.uid and p.info["cmdline"] == ["sleep", "2"]
        ]
        pid = proc.pid
        # What the simulated driver knows (sim/registry.py): 1 GiB charged to the job's
        # command, a context it will not free when the process ends.
        (tmp / "sim" / "alloc" / f"{pid}.json").write_text(
            json.dumps(
                {
                    "pid": pid,
                    "start_time": proc.create_time(),
                    "leak": True,
                    "command": "sleep",
                    "gpus": {job["gpu_uuids"][0]: 1 << 30},
                }
            )
        )
        d.wait_state(jid, "succeeded", "failed")
        time.sleep(1.2)  # a later start than the job's, beyond any clock tolerance
        victim = pidns.spawn_with_pid(pid, b, ["sleep", "300"])
        wait_for(
            lambda d=d, jid=jid: d.job(jid)["events"],
            30,
            0.2,
            until=lambda events: any(e["kind"] == "leak" for e in events),
            what=lambda events: f"no leak recorded: {events}",
        )
        time.sleep(3)  # the reap runs right after the leak is recorded; give it the grace
        return {
            "pid": pid,
            "victim_alive": pidns.alive(victim),
            "events": [[e["kind"], e["detail"]] for e in d.job(jid)["events"]],
        }
    raise AssertionError("no daemon")


def test_a_reused_pid_of_a_leaked_job_is_not_reaped(
    users: tuple[User, User], pidns_ok: None
) -> None:
    out = pidns.run(f"{__name__}:reused_leak_pid", {"users": pidns.users_args(*users)})
    assert out["victim_alive"], out["events"]
    assert not any(k == "reaped" and f"pid {out['pid']}" in (d or "") for k, d in out["events"]), (
        out["events"]
    )
