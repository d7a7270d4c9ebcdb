"""Root's ``reap`` leaves a running job's workers alone.

A's jobs fork workers that inherit the GPU's device file, as DataLoader workers do: the
driver lists none of them, so they look like hidden holders. Root's ``reap --yes`` must
leave every process of a running job (the daemon's view of its tree) and still reap a
stray holder of B's that no job owns (also when the job's environment holds no
GPUWARDEN_JOB); a job's worker named with ``--pid`` may still be
reaped."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import psutil
import pytest

from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, start_daemon
from tests.security import pidns
from tests.security.pidns import User

JOB_PY = "/usr/bin/python3"  # one every user may run (the job needs the stdlib only)

# The job: holds its GPU's device files, forks two workers that inherit them and stay,
# and succeeds only if both workers end by themselves.
_JOB = """
import os, sys, time
dev = sys.argv[2]
held = [open(os.path.join(dev, n), "rb") for n in ("nvidiactl", "nvidia-uvm", "nvidia0")]
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        time.sleep(float(sys.argv[1]))
        os._exit(0)
    kids.append(pid)
codes = [os.waitpid(k, 0)[1] for k in kids]
sys.exit(0 if all(c == 0 for c in codes) else 1)
"""


def _procs(uid: int, seconds: str) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["uids", "cmdline"])
        if p.info["uids"]
        and p.info["uids"].real == uid
        and p.info["cmdline"][-2:-1] == [seconds]
        and "-c" in p.info["cmdline"]
    ]


def workers_survive_reap(args: dict[str, Any]) -> dict[str, Any]:
    a, b = (pidns.user(u) for u in args["users"])
    tmp = pidns.tmp_home()
    for d in start_daemon(tmp, EXAMPLES / "idle-2gpu.json"):
        env = pidns.env_of(d.env, a)
        jobs = {}
        dev = str(tmp / "sim" / "dev")
        # The second job runs with an empty environment (no GPUWARDEN_JOB anywhere in
        # its tree): only the daemon's view tells its workers from strays.
        for seconds, wrap in (("12", []), ("300", ["/usr/bin/env", "-i"])):
            r = d.cli(
                "submit",
                "--cwd",
                a.home,
                "--mem",
                "1G",
                "--",
                *wrap,
                JOB_PY,
                "-c",
                _JOB,
                seconds,
                dev,
                env=env,
                prefix=a.prefix,
            )
            assert r.returncode == 0, r.stderr
            jobs[seconds] = int(r.stdout)
            d.wait_state(jobs[seconds], "running")
        stray = subprocess.Popen(
            [*b.prefix, PY, "-m", "gpuwarden.sim.job", "--hold-only", "--seconds", "120"],
            stdout=subprocess.PIPE,
            text=True,
            env={**pidns.env_of(d.env, b), "CUDA_VISIBLE_DEVICES": "1"},
        )
        assert stray.stdout is not None and stray.stdout.readline().startswith("ready")
        wait_for(
            lambda jobs=jobs: {s: len(_procs(a.uid, s)) for s in jobs},
            30,
            0.1,
            until=lambda counts: min(counts.values()) >= 3,
            what=lambda counts: f"the jobs' workers did not start: processes {counts}",
        )
        time.sleep(0.5)  # the workers have opened nothing new: they inherited the files
        procs = {s: _procs(a.uid, s) for s in jobs}
        worker = next(p for p in procs["300"] if p.ppid() in {q.pid for q in procs["300"]})
        bare = [("GPUWARDEN_JOB" in p.environ()) for p in procs["300"]]
        found = d.json("leaks", "--samples", "1")["leaks"]
        holders = {lk["pid"] for lk in found if lk["kind"] == "hidden_holder"}
        reap = d.cli("reap", "--yes", "--json", "--samples", "1", "--grace", "2", "--timeout", "5")
        alive_after = {s: [pidns.alive(p) for p in ps] for s, ps in procs.items()}
        stray_alive = stray.poll() is None
        named = d.cli(
            "reap",
            "--yes",
            "--json",
            "--pid",
            str(worker.pid),
            "--samples",
            "1",
            "--grace",
            "2",
            "--timeout",
            "5",
        )
        end = d.wait_state(jobs["12"], "succeeded", "failed", timeout=60)
        stray.kill()
        return {
            "holders": sorted(holders),
            "job_pids": {s: [p.pid for p in ps] for s, ps in procs.items()},
            "reap": json.loads(reap.stdout),
            "alive_after": alive_after,
            "stray_alive": stray_alive,
            "stray_pid": stray.pid,
            "named": named.stdout or named.stderr,
            "named_alive": pidns.alive(worker),
            "end": [end["state"], end["exit_code"], end["reason"]],
            "bare": bare,
        }
    raise AssertionError("no daemon")


def test_root_reap_leaves_running_jobs_workers(users: tuple[User, User], pidns_ok: None) -> None:
    if not os.access(JOB_PY, os.X_OK):
        pytest.skip(f"needs {JOB_PY}")
    out = pidns.run(f"{__name__}:workers_survive_reap", {"users": pidns.users_args(*users)})
    job_pids = {p for ps in out["job_pids"].values() for p in ps}
    assert job_pids <= set(out["holders"]), out  # they do look like hidden holders
    assert out["bare"] == [False] * 3, out["bare"]
    assert all(all(v) for v in out["alive_after"].values()), out["reap"]
    left = {a["pid"]: a for a in out["reap"]["actions"] if a["pid"] in job_pids}
    assert set(left) == job_pids and all(a["action"] == "none" for a in left.values())
    assert all("running gpuwarden job" in a["reason"] for a in left.values())
    assert not out["stray_alive"], out["reap"]  # reap still acts on what no job owns
    assert out["end"][:2] == ["succeeded", 0], out["end"]
    [named] = json.loads(out["named"])["actions"]
    assert named["action"] == "terminate" and named["result"] in ("terminated", "killed")
    assert not out["named_alive"]
