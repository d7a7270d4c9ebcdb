"""The job daemon on a real GPU: torch jobs with memory budgets share it as placed, none
runs out of memory, their peaks are recorded, and a job past its budget fails alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

GiB = 1 << 30
SRC = str(Path(__file__).resolve().parents[2] / "src")
TORCH_JOB = (
    "import torch, time, sys; n = int(sys.argv[1]); "
    "x = torch.empty(n, dtype=torch.uint8, device='cuda'); x.fill_(1); "
    "torch.cuda.synchronize(); time.sleep(float(sys.argv[2])); print('done', n)"
)


def _cli(env: dict[str, str], *args: str, timeout: float = 120) -> Any:
    r = subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


@pytest.mark.gpu
def test_budgeted_torch_jobs_share_the_gpu_and_peaks_are_recorded() -> None:
    pytest.importorskip("torch")
    short = Path(tempfile.mkdtemp(prefix="gw-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_VISIBLE"))}
    env.update(GPUWARDEN_HOME=str(short / "home"), PYTHONPATH=SRC)
    (short / "home").mkdir()
    (short / "home" / "config.toml").write_text('interval = "200ms"\n')
    try:
        _cli(env, "daemon", "start")
        ids = []
        for gib in (10, 12, 14, 16):
            out = _cli(
                env,
                "submit",
                "--mem",
                f"{gib + 4}G",
                "--",
                sys.executable,
                "-c",
                TORCH_JOB,
                str(gib * GiB),
                "6",
            )
            ids.append(int(out))
        over = int(
            _cli(
                env,
                "submit",
                "--mem",
                "4G",
                "--retries",
                "0",
                "--",
                sys.executable,
                "-c",
                TORCH_JOB,
                str(8 * GiB),
                "1",
            )
        )  # no OOM retry: it fails
        deadline = time.monotonic() + 60
        running: set[int] = set()
        while time.monotonic() < deadline and len(running) < len(ids):
            jobs = json.loads(_cli(env, "ps", "--all", "--json"))["jobs"]
            running |= {j["id"] for j in jobs if j["state"] == "running" and j["id"] in ids}
            time.sleep(0.3)
        assert running == set(ids), "the four budgeted jobs should run side by side"
        for jid in ids:
            subprocess.run(
                [sys.executable, "-m", "gpuwarden", "wait", str(jid)],
                env=env,
                timeout=180,
                check=True,
            )
        subprocess.run([sys.executable, "-m", "gpuwarden", "wait", str(over)], env=env, timeout=180)
        for gib, jid in zip((10, 12, 14, 16), ids, strict=True):
            job = json.loads(_cli(env, "show", str(jid), "--json"))
            print(jid, job["state"], job["gpus"], job["mem"], job["peak_memory"])
            assert job["state"] == "succeeded", job
            assert job["peak_memory"] is not None and job["peak_memory"] >= gib * GiB
            assert job["peak_memory"] <= job["mem"]
        job = json.loads(_cli(env, "show", str(over), "--json"))
        err = _cli(env, "logs", "--stderr", str(over))
        print(job["state"], err[-400:])
        assert job["state"] == "failed" and "OutOfMemoryError" in err
    finally:
        subprocess.run([sys.executable, "-m", "gpuwarden", "daemon", "stop"], env=env, timeout=60)
        shutil.rmtree(short, ignore_errors=True)
