"""Jobs another launcher starts, registered with the node's daemon: the Ray entrypoint
(``python -m gpuwarden.ray.entry``, run here without Ray, as Ray would run it on a node
whose CUDA_VISIBLE_DEVICES it chose) against a real daemon over the simulated
2 x 24 GiB machine. The daemon queues, places and watches the job; the entrypoint starts
it and reports its end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import Daemon, http_request, raw_http, start_daemon

PY = sys.executable
GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Daemon]:
    yield from start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", 'release_timeout = "2s"\n')


def entry(
    d: Daemon,
    mem: str,
    *command: str,
    gpu: int = 1,
    sid: str = "raysubmit_t1",
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """The entrypoint as Ray starts it on the node: CUDA_VISIBLE_DEVICES set by Ray."""
    return subprocess.Popen(
        [
            PY,
            "-m",
            "gpuwarden.ray.entry",
            "--mem",
            str(_bytes(mem)),
            "--gpus",
            "1",
            "--submission-id",
            sid,
            "--",
            *command,
        ],
        env={**d.env, "CUDA_VISIBLE_DEVICES": str(gpu), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _bytes(size: str) -> int:
    from gpuwarden.units import parse_size

    return parse_size(size)


def sim(mem: str, seconds: float, *extra: str) -> list[str]:
    return [PY, "-m", "gpuwarden.sim.job", "--mem", mem, "--seconds", str(seconds), *extra]


def attached_jobs(d: Daemon) -> list[dict[str, Any]]:
    return [j for j in d.json("ps", "--all")["jobs"] if j.get("attach")]


def wait_attached(d: Daemon, count: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
    return list(
        wait_for(
            lambda: attached_jobs(d),
            timeout,
            0.1,
            until=lambda jobs: len(jobs) >= count,
            what=lambda jobs: f"{count} attached job(s) never showed: {jobs}",
        )
    )


def finish(p: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out + err


def test_an_attached_job_is_placed_watched_and_ended_by_the_node_daemon(node: Daemon) -> None:
    p = entry(node, "4G", *sim("3G", 3))
    [job] = wait_attached(node)
    assert job["attach"] == "ray job raysubmit_t1" and job["gpu_ids"] == [1]
    running = node.wait_state(job["id"], "running")
    assert running["budget"] == 4 * GiB and running["gpus"] == [1]
    # The daemon sees the command's memory as the job's.
    peak = wait_for(
        lambda: node.job(job["id"])["peak_memory"],
        10,
        0.1,
        until=lambda v: v is not None,
        what="the job's peak memory",
    )
    assert peak == 3 * GiB + 512 * MiB  # its CUDA context too
    status = node.json("status")
    gpu1 = next(g for g in status["gpus"] if g["index"] == 1)
    assert any(pr.get("job") == str(job["id"]) for pr in gpu1["processes"]), gpu1
    assert "[ray job raysubmit_t1] " in node.cli("ps", check=True).stdout
    assert (
        "started by ray job raysubmit_t1 (attached"
        in node.cli("show", str(job["id"]), check=True).stdout
    )
    code, out = finish(p)
    assert code == 0, out
    assert f"registered as job {job['id']} with this node's gpuwarden daemon" in out
    done = node.wait_for_release(job["id"])
    assert done["state"] == "succeeded" and done["exit_code"] == 0
    assert done["memory_release"]["how"] == "verified"
    kinds = [e["kind"] for e in done["events"]]
    assert kinds[:4] == ["submitted", "placed", "started", "succeeded"], kinds


def test_an_attached_job_waits_in_the_node_queue_for_memory(node: Daemon) -> None:
    big = node.submit("--mem", "20G", "--gpu-ids", "1", cmd=sim("19G", 4))
    node.wait_state(big, "running")
    p = entry(node, "10G", *sim("1G", 0.5))
    [job] = wait_attached(node)
    time.sleep(1.0)
    waiting = node.job(job["id"])
    assert waiting["state"] == "queued" and waiting["reason"], waiting
    code, out = finish(p)
    assert code == 0, out
    first, second = node.job(big), node.wait_state(job["id"], "succeeded")
    assert second["started_at"] >= first["ended_at"]


def test_cancel_stops_the_attached_command_through_its_launcher(node: Daemon) -> None:
    p = entry(node, "4G", *sim("2G", 60))
    [job] = wait_attached(node)
    node.wait_state(job["id"], "running")
    node.cli("cancel", str(job["id"]), check=True)
    code, out = finish(p)
    assert code == 128 + signal.SIGTERM, out
    done = node.wait_for_release(job["id"])
    assert done["state"] == "cancelled" and done["memory_release"]["how"] == "verified"


def test_a_launcher_killed_mid_run_is_a_lost_job_and_its_orphans_are_reaped(node: Daemon) -> None:
    # Its output goes to a file, so it does not die of a broken pipe with its launcher.
    quiet = " ".join(sim("2G", 120)) + " >/dev/null 2>&1"
    p = entry(node, "4G", "sh", "-c", f"exec {quiet}")
    [job] = wait_attached(node)
    node.wait_state(job["id"], "running")
    child = [
        c for c in psutil.Process(p.pid).children() if "gpuwarden.sim.job" in " ".join(c.cmdline())
    ]
    assert child
    p.kill()  # what SIGKILL from Ray (or the OOM killer) does to the entrypoint
    p.communicate()
    lost = node.wait_state(job["id"], "failed")
    assert lost["reason"] == "supervisor lost"
    released = node.wait_for_release(job["id"], timeout=40)  # the orphan held GPU memory
    assert (
        not psutil.pid_exists(child[0].pid)
        or psutil.Process(child[0].pid).status() == psutil.STATUS_ZOMBIE
    )
    assert any(e["kind"] == "reaped" for e in released["events"]), released["events"]


def test_a_queued_attached_job_whose_launcher_dies_is_cancelled(node: Daemon) -> None:
    big = node.submit("--mem", "20G", "--gpu-ids", "1", cmd=sim("19G", 30))
    node.wait_state(big, "running")
    p = entry(node, "10G", *sim("1G", 1))
    [job] = wait_attached(node)
    p.kill()
    p.communicate()
    gone = node.wait_state(job["id"], "cancelled")
    assert "went away" in gone["reason"]
    node.cli("cancel", str(big), check=True)


def test_a_cuda_oom_is_recorded_and_left_to_the_launcher(node: Daemon) -> None:
    p = entry(node, "2G", *sim("3G", 1))
    code, out = finish(p)
    assert code != 0 and "CUDA out of memory" in out, out
    [job] = attached_jobs(node)
    done = node.wait_state(job["id"], "failed")
    oom = [e for e in done["events"] if e["kind"] == "oom"]
    assert oom and "launcher" in oom[0]["detail"]
    assert "CUDA out of memory" in node.cli("logs", str(job["id"]), "--stderr").stdout


def test_the_daemon_restarting_keeps_the_attached_job(node: Daemon) -> None:
    p = entry(node, "4G", *sim("2G", 5))
    [job] = wait_attached(node)
    node.wait_state(job["id"], "running")
    node.stop()
    node.start()
    assert node.job(job["id"])["state"] == "running"
    code, out = finish(p)
    assert code == 0, out
    assert node.wait_state(job["id"], "succeeded")["exit_code"] == 0


def _post(d: Daemon, path: str, body: Any) -> tuple[int, Any]:
    status, raw = raw_http(
        d.socket,
        http_request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}),
    )
    return status, json.loads(raw)


def test_only_the_launcher_reports_and_attached_jobs_refuse_what_cannot_apply(node: Daemon) -> None:
    p = entry(node, "4G", *sim("1G", 30))
    [job] = wait_attached(node)
    node.wait_state(job["id"], "running")
    # This test process is not the launcher: it may not report for it.
    status, body = _post(node, f"/v1/jobs/{job['id']}/ended", {"exit_code": 0})
    assert status == 403 and "only the process that attached" in body["error"]
    status, body = _post(node, f"/v1/jobs/{job['id']}/started", {"pid": os.getpid()})
    assert status == 403
    for extra in ({"retries": 2}, {"timeout": 60}, {"mps": True}, {"key": "k"}):
        status, body = _post(
            node, "/v1/jobs", {"command": ["x"], "attach": "ray job y", "mem": "1G", **extra}
        )
        assert status == 400 and "started and ended by its launcher" in body["error"], body
    status, body = _post(node, "/v1/jobs", {"command": ["x"], "attach": ""})
    assert status == 400
    node.cli("cancel", str(job["id"]), check=True)
    finish(p)
    node.wait_state(job["id"], "cancelled")
    r = node.cli("retry", str(job["id"]))
    assert r.returncode != 0 and "retry it there" in r.stderr


def test_without_a_daemon_the_entrypoint_runs_the_job_itself(tmp_path: Path) -> None:
    from tests.integration.daemon_fixture import make_env

    env = make_env(tmp_path, EXAMPLES / "idle-2gpu.json")  # GPUWARDEN_HOME: no daemon there
    r = subprocess.run(
        [PY, "-m", "gpuwarden.ray.entry", "--mem", str(4 * GiB), "--", *sim("1G", 0.2)],
        env={**env, "CUDA_VISIBLE_DEVICES": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "registered" not in r.stderr and "its GPU memory is back" in r.stderr


def test_a_job_the_node_can_never_hold_fails_at_once_with_the_daemons_reason(node: Daemon) -> None:
    code, out = finish(entry(node, "30G", *sim("1G", 0.2)))  # 24 GiB GPUs
    assert attached_jobs(node) == []  # refused at registration: nothing to wait for
    assert code == 2 and "this job can never run here: 30.0GiB per GPU" in out, out
    assert "Traceback" not in out


def test_registering_can_be_turned_off_on_a_node_with_a_daemon(node: Daemon) -> None:
    code, out = finish(entry(node, "4G", *sim("1G", 0.2), env={"GPUWARDEN_REGISTER": "0"}))
    assert code == 0, out
    assert "registered" not in out and attached_jobs(node) == []


@pytest.mark.parametrize("resources", ["[1]", '{"x": "a"}', "{not json"])
def test_bad_resources_are_one_line(tmp_path: Path, resources: str) -> None:
    r = subprocess.run(
        [PY, "-m", "gpuwarden.ray.entry", "--mem", "1", "--resources", resources, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--resources must be a JSON object" in r.stderr
    assert "Traceback" not in r.stderr
