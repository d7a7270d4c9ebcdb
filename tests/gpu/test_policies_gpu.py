"""The queue's policies on a real GPU with real torch jobs: a CUDA OOM retried with a
bigger budget succeeds; a besteffort job preempted by a guaranteed one is requeued and
finishes later, and how long its memory took to come back is measured."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_daemon import GpuDaemon

GiB = 1 << 30
# Allocates argv[1] bytes, holds them argv[2] seconds. With argv[3] (a marker path): the
# first attempt holds for argv[2] s, a later one (marker present) for 1 s.
TORCH_JOB = """\
import os, pathlib, signal, sys, time
import torch
n, hold = int(sys.argv[1]), float(sys.argv[2])
if len(sys.argv) > 3:
    marker = pathlib.Path(sys.argv[3])
    if marker.exists():
        hold = 1.0
    marker.touch()
def stop(*_):
    notice = os.environ.get("GPUWARDEN_PREEMPT_FILE")
    print("stopping; notice", os.path.exists(notice) if notice else None, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("holding", n, flush=True)
time.sleep(hold)
print("done", flush=True)
"""


@pytest.fixture
def gd() -> Iterator[GpuDaemon]:
    pytest.importorskip("torch")
    d = GpuDaemon('retry_backoff = "1s"\ngrace = "5s"\n')
    d.cli("daemon", "start")
    try:
        yield d
    finally:
        d.stop()


def _at(job: dict[str, Any], kind: str) -> float:
    e = next(e for e in job["events"] if e["kind"] == kind)
    return datetime.fromisoformat(e["at"]).timestamp()


@pytest.mark.gpu
def test_a_cuda_oom_is_retried_with_a_bigger_budget_and_succeeds(gd: GpuDaemon) -> None:
    jid = gd.submit(
        "--mem",
        "5G",
        "--retries",
        "2",
        "--",
        sys.executable,
        "-c",
        TORCH_JOB,
        str(int(5.5 * GiB)),
        "3",
    )
    r = gd.cli("wait", str(jid), check=False)
    job = gd.job(jid)
    print(
        json.dumps(
            {
                k: job[k]
                for k in (
                    "state",
                    "mem",
                    "request",
                    "budget",
                    "peak_memory",
                    "oom_retries",
                    "attempts",
                )
            }
        )
    )
    for e in job["events"]:
        print(e["at"], e["kind"], e["detail"])
    assert r.returncode == 0 and job["state"] == "succeeded"
    assert job["oom_retries"] == 1 and job["request"] >= int(1.25 * 5 * GiB)
    oom = next(e for e in job["events"] if e["kind"] == "oom")
    assert "out of memory" in oom["detail"].lower()
    # The driver's figure: the allocations within the budget, the context booked beside.
    assert job["peak_memory"] <= job["budget"] + job["context"] + 256 * (1 << 20), (
        job["peak_memory"],
        job["budget"],
        job["context"],
    )


@pytest.mark.gpu
def test_a_preempted_besteffort_job_is_requeued_and_finishes(gd: GpuDaemon, tmp_path: Path) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    big = int(total * 0.6)  # the two cannot share the GPU
    marker = tmp_path / "marker"
    os.chmod(tmp_path, 0o777)
    # Both on GPU 0: on a machine with more GPUs the guaranteed job would just take
    # another one (as it did on two H200s) and nothing would need preempting.
    victim = gd.submit(
        "--qos",
        "besteffort",
        "--gpu-ids",
        "0",
        "--mem",
        f"{big + 2 * GiB}B",
        "--checkpoint",
        "--",
        sys.executable,
        "-c",
        TORCH_JOB,
        str(big),
        "300",
        str(marker),
    )
    deadline = time.monotonic() + 120
    while "holding" not in gd.cli("logs", str(victim), check=False).stdout:
        assert time.monotonic() < deadline, gd.job(victim)
        time.sleep(0.3)
    boss = gd.submit(
        "--qos",
        "guaranteed",
        "--gpu-ids",
        "0",
        "--mem",
        f"{big + 2 * GiB}B",
        "--",
        sys.executable,
        "-c",
        TORCH_JOB,
        str(big),
        "3",
    )
    assert gd.cli("wait", str(boss), check=False).returncode == 0, gd.job(boss)
    assert gd.cli("wait", str(victim), check=False).returncode == 0, gd.job(victim)
    v, b = gd.job(victim), gd.job(boss)
    for e in v["events"]:
        print("victim", e["at"], e["kind"], e["detail"])
    for e in b["events"]:
        print("boss", e["at"], e["kind"], e["detail"])
    assert v["state"] == "succeeded" and v["preemptions"] == 1
    assert b["state"] == "succeeded" and b["preemptions"] == 0
    first = (gd.home / "jobs" / str(victim) / "attempt-0" / "stdout").read_text()
    assert "stopping; notice True" in first
    released = _at(b, "placed") - _at(v, "preempted")
    print(f"preempted -> room given to the guaranteed job: {released:.2f} s")
    assert released < 30
    for name, jid in (("victim", victim), ("guaranteed", boss)):
        rel = gd.released(jid)
        print(
            f"{name}: {rel['budget'] / GiB:.1f} GiB back {rel['seconds']:.3f} s after "
            f"its end ({rel['how']})"
        )
        assert rel["how"] == "verified" and rel["leak"] is None and rel["seconds"] < 10


@pytest.mark.gpu
def test_an_mps_job_past_its_budget_fails_while_its_neighbour_runs_on(gd: GpuDaemon) -> None:
    from gpuwarden.mps.state import read_mps_state

    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control is not installed")
    if read_mps_state().controls:
        pytest.skip("another MPS control daemon runs here; not interfering")
    neighbour = gd.submit(
        "--mps", "--mem", "4G", "--", sys.executable, "-c", TORCH_JOB, str(2 * GiB), "20"
    )
    deadline = time.monotonic() + 120
    while "holding" not in gd.cli("logs", str(neighbour), check=False).stdout:
        assert time.monotonic() < deadline, gd.job(neighbour)
        time.sleep(0.3)
    status = json.loads(gd.cli("status", "--json").stdout)
    for gpu in status["gpus"]:
        for p in gpu["processes"]:
            print("NVML lists:", p["pid"], p.get("memory"), p.get("command", "")[:60])
    # The greedy job escapes the PyTorch cap (as non-PyTorch allocations would): only the
    # MPS limit stands between it and its neighbour's memory.
    greedy = gd.submit(
        "--mps",
        "--mem",
        "3G",
        "--retries",
        "0",  # no OOM retry: it fails
        "--",
        "env",
        "-u",
        "GPUWARDEN_MEM_LIMIT",
        sys.executable,
        "-c",
        TORCH_JOB,
        str(5 * GiB),
        "1",
    )
    assert gd.cli("wait", str(greedy), check=False).returncode != 0
    g = gd.job(greedy)
    err = (gd.home / "jobs" / str(greedy) / "attempt-0" / "stderr").read_text()
    print("greedy:", g["state"], g["reason"], err.strip().splitlines()[-1:])
    assert g["state"] == "failed" and "out of memory" in err.lower()
    assert "oom" in [e["kind"] for e in g["events"]]
    assert g["enforcement"]["hard"].startswith("MPS pinned device memory limit")
    n = gd.job(neighbour)
    assert n["state"] == "running", n  # its server and its memory are untouched
    assert gd.cli("wait", str(neighbour), check=False).returncode == 0
    assert gd.job(neighbour)["state"] == "succeeded"
    # With no MPS job left, gpuwarden quits the daemon it started for them.
    deadline = time.monotonic() + 30
    while [c for c in read_mps_state().controls if str(gd.home) in (c.pipe_dir or "")]:
        assert time.monotonic() < deadline, "the MPS daemon was not quit"
        time.sleep(0.3)


@pytest.mark.gpu
def test_cpus_held_alone_on_a_one_node_machine(gd: GpuDaemon) -> None:
    jid = gd.submit(
        "--cpus",
        "4",
        "--mem",
        "2G",
        "--",
        sys.executable,
        "-c",
        "import os; print(sorted(os.sched_getaffinity(0)))",
    )
    assert gd.cli("wait", str(jid), check=False).returncode == 0
    job = gd.job(jid)
    launched = next(e for e in job["events"] if e["kind"] == "launched")
    print(job["cpu_set"], launched["detail"])
    assert len(job["cpu_set"]) == 4
    assert gd.cli("logs", str(jid)).stdout.strip() == str(job["cpu_set"])
    nodes = [
        n
        for n in os.listdir("/sys/devices/system/node")
        if n.startswith("node") and n[4:].isdigit()
    ]
    if len(nodes) == 1:
        assert "one NUMA node here" in launched["detail"]
