"""What ``--mem`` means, with real torch jobs on the real GPU (issue: pack real jobs):

- a job whose tensors take exactly what it declared succeeds, and NVML shows it at its
  budget plus its CUDA context, which the daemon then measures for this GPU model;
- a job that grows to 2.5x its declaration in one step succeeds after exactly one retry,
  placed at once with the budget its OOM message showed it needs;
- with no --timeout anywhere, a small job that fits starts at once beside a big one
  waiting for room (no head-of-line blocking)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from tests.gpu.gpu_daemon import GpuDaemon

GiB = 1 << 30
MiB = 1 << 20
# Allocates argv[1] bytes, then (argv[3], when given) grows to that many in one step after
# a second, and holds it all for argv[2] seconds.
TORCH_JOB = (
    "import torch, time, sys; n = int(sys.argv[1]); "
    "x = torch.empty(n, dtype=torch.uint8, device='cuda'); x.fill_(1); "
    "torch.cuda.synchronize(); time.sleep(1.0)\n"
    "if len(sys.argv) > 3:\n"
    "    y = torch.empty(int(sys.argv[3]) - n, dtype=torch.uint8, device='cuda')\n"
    "    y.fill_(1)\n"
    "torch.cuda.synchronize(); time.sleep(float(sys.argv[2])); print('done')"
)


@pytest.fixture
def gd() -> Iterator[GpuDaemon]:
    pytest.importorskip("torch")
    d = GpuDaemon()
    d.cli("daemon", "start")
    try:
        yield d
    finally:
        d.stop()


def _at(job: dict[str, object], kind: str) -> list[float]:
    return [
        datetime.fromisoformat(e["at"]).timestamp()  # type: ignore[index]
        for e in job["events"]
        if e["kind"] == kind
    ]  # type: ignore[attr-defined, index]


def _wait(gd: GpuDaemon, jid: int, *states: str, timeout: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        job = gd.job(jid)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


@pytest.mark.gpu
def test_a_job_allocating_exactly_its_declaration_succeeds(gd: GpuDaemon) -> None:
    import pynvml

    jid = gd.submit("--mem", "10G", "--", sys.executable, "-c", TORCH_JOB, str(10 * GiB), "4")
    _wait(gd, jid, "running")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gd.job(jid)["gpus"][0])
        seen = 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and seen < 10 * GiB:
            seen = max(
                [p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
                or [0]
            )
            time.sleep(0.2)
    finally:
        pynvml.nvmlShutdown()
    job = _wait(gd, jid, "succeeded", "failed")
    print(
        {k: job[k] for k in ("state", "budget", "context", "peak_memory", "allocated_peak")},
        "nvml",
        seen,
    )
    assert job["state"] == "succeeded" and job["oom_retries"] == 0, job
    assert 10 * GiB < seen <= 10 * GiB + 2 * GiB  # the budget and its CUDA context
    assert job["allocated_peak"] == 10 * GiB  # the cap hook's report
    # The context measured from it is booked for the next job on this GPU model.
    nxt = gd.submit("--mem", "1G", "--", sys.executable, "-c", TORCH_JOB, str(GiB), "0")
    done = _wait(gd, nxt, "succeeded", "failed")
    assert done["state"] == "succeeded"
    measured = job["peak_memory"] - 10 * GiB  # type: ignore[operator]
    samples = gd.context_samples()
    why = (done["context"], measured, samples, done["events"])
    assert abs(done["context"] - measured) <= MiB, why  # type: ignore[operator]


@pytest.mark.gpu
def test_a_job_growing_past_its_declaration_heals_in_one_retry(gd: GpuDaemon) -> None:
    jid = gd.submit(
        "--mem", "4G", "--", sys.executable, "-c", TORCH_JOB, str(2 * GiB), "2", str(10 * GiB)
    )
    job = _wait(gd, jid, "succeeded", "failed", timeout=180)
    for e in job["events"]:  # type: ignore[attr-defined]
        print(e["at"], e["kind"], e["detail"])
    assert job["state"] == "succeeded" and job["oom_retries"] == 1, job
    assert job["budget"] >= 10 * GiB  # type: ignore[operator]
    retried, placed = _at(job, "retried"), _at(job, "placed")
    assert len(placed) == 2 and placed[1] - retried[0] < 2.0  # within a pass or so


@pytest.mark.gpu
def test_a_small_job_that_fits_starts_beside_a_big_one_waiting(gd: GpuDaemon) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    big, waiting, small = int(total * 0.45), int(total * 0.65), int(total * 0.4)
    running = gd.submit(
        "--gpu-ids",
        "0",
        "--mem",
        f"{big}B",
        "--",
        sys.executable,
        "-c",
        TORCH_JOB,
        str(big // 2),
        "12",
    )
    _wait(gd, running, "running")
    head = gd.submit(
        "--gpu-ids",
        "0",
        "--mem",
        f"{waiting}B",
        "--",
        sys.executable,
        "-c",
        TORCH_JOB,
        str(GiB),
        "0",
    )
    fits = gd.submit(
        "--gpu-ids", "0", "--mem", f"{small}B", "--", sys.executable, "-c", TORCH_JOB, str(GiB), "2"
    )
    started = _wait(gd, fits, "running", "succeeded", timeout=30)
    assert gd.job(head)["state"] == "queued"  # still waiting for the room the first holds
    assert _at(started, "placed")[0] < _at(gd.job(running), "started")[0] + 12
    for jid in (running, head, fits):
        assert _wait(gd, jid, "succeeded", "failed", timeout=180)["state"] == "succeeded"
