"""gpuwarden on Ray over the real GPU: a one-node Ray cluster whose node runs a private
gpuwarden daemon. Two Ray jobs with budgets share the GPU and the one that goes past its
cap runs out of memory alone; both are registered with the node's daemon, which sees
their real memory through NVML. A decorated task that runs out of memory at its budget
is run again with a bigger one. Needs Ray (``scripts/gpu-ray-check.sh`` carries it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_daemon import GpuDaemon
from tests.integration.daemon_fixture import free_port

ray = pytest.importorskip("ray")

from ray.job_submission import JobStatus, JobSubmissionClient  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.ray]
GiB = 1 << 30
DONE = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)


@dataclass
class Node:
    gcs: str
    dashboard: str
    daemon: GpuDaemon
    client: Any

    def wait(self, sid: str, timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.client.get_job_status(sid)
            if status in DONE:
                return status
            time.sleep(0.3)
        raise AssertionError(f"{sid}: {self.client.get_job_logs(sid)}")


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    ray_bin = shutil.which("ray")
    if ray_bin is None:
        pytest.skip("the ray command is not on PATH")
    daemon = GpuDaemon()
    daemon.cli("daemon", "start")
    tmp = Path(tempfile.mkdtemp(prefix="gwray-"))
    env = {
        **daemon.env,
        "RAY_USAGE_STATS_ENABLED": "0",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([daemon.env["PYTHONPATH"], os.environ.get("PYTHONPATH", "")]),
    }
    resources = daemon.cli("cluster", "resources").stdout.strip()
    port, dash = free_port(), free_port()
    try:
        subprocess.run(
            [
                ray_bin,
                "start",
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={port}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dash}",
                "--num-gpus=1",
                "--num-cpus=8",
                f"--resources={resources}",
                f"--temp-dir={tmp}",
                "--disable-usage-stats",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=180,
        )
        client = None
        deadline = time.monotonic() + 90
        while client is None:
            try:
                client = JobSubmissionClient(f"http://127.0.0.1:{dash}")
            except Exception:
                assert time.monotonic() < deadline, "the Ray dashboard did not come up"
                time.sleep(0.5)
        yield Node(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", daemon, client)
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def hold(gib: float, seconds: float) -> list[str]:
    return [
        "python",
        "-c",
        f"import torch, time; x = torch.empty({int(gib * GiB)}, dtype=torch.uint8, "
        f"device='cuda'); print('HELD', x.numel(), flush=True); time.sleep({seconds})",
    ]


def test_two_ray_jobs_share_the_gpu_and_the_one_past_its_cap_fails_alone(node: Node) -> None:
    from gpuwarden.ray.submit import submit

    fits = submit(node.dashboard, mem=20 * GiB, gpus=1, command=hold(12, 15), name="fits")
    time.sleep(3)
    greedy = submit(node.dashboard, mem=20 * GiB, gpus=1, command=hold(30, 5), name="greedy")
    assert node.wait(greedy) == JobStatus.FAILED
    assert node.client.get_job_status(fits) == JobStatus.RUNNING  # untouched by it
    assert node.wait(fits) == JobStatus.SUCCEEDED
    log_fits, log_greedy = (str(node.client.get_job_logs(s)) for s in (fits, greedy))
    assert "HELD" in log_fits and "its GPU memory is back" in log_fits
    assert "CUDA out of memory" in log_greedy or "OutOfMemoryError" in log_greedy
    assert "with this node's gpuwarden daemon" in log_fits
    deadline = time.monotonic() + 60
    while True:
        jobs = {
            j["name"]: j
            for j in json.loads(node.daemon.cli("ps", "--all", "--json").stdout)["jobs"]
        }
        if (
            all(j["memory_release"] and j["memory_release"]["released_at"] for j in jobs.values())
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.5)
    print(
        json.dumps(
            {
                n: {k: j[k] for k in ("state", "budget", "peak_memory", "attach")}
                for n, j in jobs.items()
            },
            indent=1,
        )
    )
    assert jobs["fits"]["state"] == "succeeded" and jobs["greedy"]["state"] == "failed"
    assert jobs["fits"]["attach"] == f"ray job {fits}"
    # NVML's figure for the job: its 12 GiB plus the CUDA context, within its budget.
    assert 12 * GiB < jobs["fits"]["peak_memory"] <= 20 * GiB
    assert any(e["kind"] == "oom" for e in jobs["greedy"]["events"])
    assert all(j["memory_release"]["how"] == "verified" for j in jobs.values())


def test_a_task_out_of_memory_at_its_budget_succeeds_with_a_bigger_one(node: Node) -> None:
    import gpuwarden.ray

    ray.init(address=node.gcs, ignore_reinit_error=True, log_to_driver=False)
    try:

        @gpuwarden.ray.remote(mem="10G", oom_retries=1)
        def take(gib: float) -> tuple[str, int]:
            import torch

            x = torch.empty(int(gib * GiB), dtype=torch.uint8, device="cuda")
            return os.environ["GPUWARDEN_BUDGET"], x.numel()

        budget, held = ray.get(take.remote(11), timeout=300)
        assert int(budget) == int(10 * GiB * 1.25) and held == 11 * GiB
    finally:
        ray.shutdown()
