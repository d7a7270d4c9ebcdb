"""A root daemon's ``--mps`` jobs on the simulated backend: each user's jobs are clients
of a control daemon that runs as that user, never of another user's, and each is quit
once that user's last MPS job has ended."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from gpuwarden.mps.state import read_mps_state
from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import Daemon, start_daemon
from tests.security import pidns
from tests.security.pidns import User
from tests.security.stdlib_job import JOB_PY

# An MPS client, as a CUDA program is one: says hello to the control daemon of its pipe
# directory (the simulated one's protocol, sim/mps.py), says what it was told and its
# limit, and stays argv[1] seconds.
_CLIENT = """
import json, os, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control"))
s.sendall(f"sim_client {os.getpid()}\\n".encode())
s.shutdown(socket.SHUT_WR)
reply = b"".join(iter(lambda: s.recv(65536), b""))
print(json.dumps({"reply": json.loads(reply), "uid": os.getuid(),
                  "limit": os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]}), flush=True)
time.sleep(float(sys.argv[1]))
"""


def _answers(d: Daemon, jobs: dict[str, int]) -> dict[str, Any]:
    """What each job's MPS client printed, by user, once all of them have."""
    said: dict[str, Any] = {}

    def all_said() -> bool:
        for name, jid in jobs.items():
            out = d.home / "jobs" / str(jid) / "attempt-0" / "stdout"
            if name not in said and out.exists() and out.read_text().strip():
                said[name] = json.loads(out.read_text())
        return len(said) == len(jobs)

    wait_for(
        all_said,
        60,
        0.2,
        what=lambda _: f"the MPS clients did not all answer: {[d.job(j) for j in jobs.values()]}",
    )
    return said


def mps_jobs_of_two_users(args: dict[str, Any]) -> dict[str, Any]:
    a, b = (pidns.user(u) for u in args["users"])
    tmp = pidns.tmp_home()
    for d in start_daemon(tmp, EXAMPLES / "idle-2gpu.json", 'context_memory = "512M"\n'):
        jobs = {}
        for u in (a, b):
            r = d.cli(
                "submit",
                "--cwd",
                u.home,
                "--mps",
                "--mem",
                "1G",
                "--gpu-ids",
                "0",
                "--",
                JOB_PY,
                "-c",
                _CLIENT,
                "8",
                env=pidns.env_of(d.env, u),
                prefix=u.prefix,
            )
            assert r.returncode == 0, r.stderr
            jobs[u.name] = int(r.stdout)
        said = _answers(d, jobs)
        controls = [
            [c.uid, c.visible_devices, c.pipe_dir]
            for c in read_mps_state().controls
            if str(d.home) in (c.pipe_dir or "")
        ]
        ends = {
            n: d.wait_state(j, "succeeded", "failed", timeout=60)["state"] for n, j in jobs.items()
        }
        wait_for(
            lambda home=str(d.home): [
                c for c in read_mps_state().controls if home in (c.pipe_dir or "")
            ],
            30,
            0.2,
            until=lambda left: not left,
            what=lambda left: f"an MPS control daemon was not quit: {left}",
        )
        return {
            "uids": {a.name: a.uid, b.name: b.uid},
            "said": said,
            "controls": controls,
            "ends": ends,
        }
    raise AssertionError("no daemon")


def test_each_users_mps_jobs_get_a_control_daemon_of_their_own(
    users: tuple[User, User], pidns_ok: None
) -> None:
    if not os.access(JOB_PY, os.X_OK):
        pytest.skip(f"needs {JOB_PY}")
    out = pidns.run(f"{__name__}:mps_jobs_of_two_users", {"users": pidns.users_args(*users)})
    uids = out["uids"]
    assert out["ends"] == {n: "succeeded" for n in uids}, out
    assert sorted(c[0] for c in out["controls"]) == sorted(uids.values()), out
    assert all(c[1] == "0" for c in out["controls"]), out
    servers = {n: s["reply"]["server"] for n, s in out["said"].items()}
    assert len(set(servers.values())) == 2, out  # never a server of another user's
    for name, s in out["said"].items():
        assert s["uid"] == uids[name] and s["reply"]["devices"] == "0", out
        assert s["limit"] == "0=1536M", out  # 1 GiB budget + 512 MiB context allowance
