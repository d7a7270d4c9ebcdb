"""/metrics on a real GPU: a torch process appears with its memory, pid and user."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.procs import end_process

GiB = 1 << 30
SRC = str(Path(__file__).resolve().parents[2] / "src")
HOLD = (
    "import torch, time; x = torch.empty(1 << 31, dtype=torch.uint8, device='cuda'); "
    "x.fill_(1); torch.cuda.synchronize(); print('ready', flush=True); time.sleep(60)"
)


@pytest.mark.gpu
def test_metrics_show_a_torch_process_with_pid_and_user() -> None:
    pytest.importorskip("torch")
    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env["PYTHONPATH"] = SRC
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "exporter", "--listen", f"127.0.0.1:{port}"], env=env
    )
    job = subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        found = None
        deadline = time.monotonic() + 30
        while found is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.3)
                continue
            for fam in text_string_to_metric_families(text):
                for smp in fam.samples:
                    if smp.name == "gpuwarden_process_memory_bytes" and smp.labels.get(
                        "pid"
                    ) == str(job.pid):
                        found = smp
            time.sleep(0.3)
        assert found is not None, "the torch process never appeared in /metrics"
        print(found)
        assert found.value >= 2 * GiB
        assert found.labels["user"] == pwd.getpwuid(os.getuid()).pw_name
    finally:
        end_process(job)
        exporter.terminate()
        exporter.wait(10)
