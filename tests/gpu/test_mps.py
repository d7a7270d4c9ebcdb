"""MPS on a real GPU (the H200 device machine, as root): ``gpuwarden mps start --yes``
starts a control daemon in private directories, its pinned memory limit holds for a torch
client, and ``mps stop --yes`` takes it down again.

Run with ``pytest -m gpu tests/gpu/test_mps.py``. The compute mode is never changed here.
torch runs in child processes so the test process holds no CUDA context."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.mps.state import read_mps_state

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
GiB = 1 << 30

# Allocates argv[1] bytes on the (only visible) GPU; with argv[2] == "hold", says "ready"
# and keeps the memory until stdin closes. Exit 3 with the message on a CUDA OOM.
CLIENT = """
import sys, torch
n = int(sys.argv[1])
try:
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
    print("oom:", str(e).splitlines()[0], flush=True)
    sys.exit(3)
print("ready", torch.cuda.device_count(), flush=True)
if sys.argv[2:] == ["hold"]:
    sys.stdin.read()
"""


def _cli_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUWARDEN_", "CUDA_MPS_")) and k != "CUDA_VISIBLE_DEVICES"
    }
    env.update(PYTHONPATH=str(SRC), COLUMNS="200")
    return env


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args],
        env=_cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _client_env(pipe: Path) -> dict[str, str]:
    env = _cli_env()
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
    # The server shows its clients only its own device, renumbered from 0. Say so: torch
    # counts GPUs through NVML first, which sees every GPU of a multi-GPU host, and then
    # asserts when the CUDA runtime under MPS shows fewer (seen on a 2x H200 machine).
    env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


@pytest.fixture
def preconditions() -> None:
    if os.geteuid() != 0:
        pytest.skip("starting an MPS control daemon needs root")
    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control is not installed")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    others = read_mps_state().controls
    if others:
        pytest.skip(f"another MPS control daemon runs (pid {others[0].pid}); not interfering")


@pytest.mark.usefixtures("preconditions")
def test_mps_daemon_enforces_the_pinned_memory_limit(tmp_path: Path) -> None:
    pipe, logs = tmp_path / "p", tmp_path / "l"  # short: MPS puts unix sockets in there
    started = _cli(
        "mps",
        "start",
        "--gpus",
        "0",
        "--pipe-dir",
        str(pipe),
        "--log-dir",
        str(logs),
        "--mem-limit",
        "0=2G",
        "--yes",
    )
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        assert "MPS control daemon started" in started.stdout

        r = _cli("mps", "status", "--json", "--pipe-dir", str(pipe))
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        controls = [d for d in data["daemons"] if d["kind"] == "control"]
        assert len(controls) == 1, data
        c = controls[0]
        assert Path(c["pipe_dir"]) == pipe and Path(c["log_dir"]) == logs
        assert c["visible_devices"] == "0" and c["pinned_mem_limit"] == "0=2G"
        assert c["user"] == "root"
        assert data["pipes"][0]["reachable"] and data["pipes"][0]["error"] is None, data

        # 1 GiB fits under the 2G limit; while it is held, an MPS server serves it.
        holder = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(GiB), "hold"],
            env=_client_env(pipe),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline()
            assert line.split() == ["ready", "1"], (line, holder.stderr and holder.stderr.read())
            r = _cli("mps", "status", "--json", "--pipe-dir", str(pipe))
            data = json.loads(r.stdout)
            assert data["pipes"][0]["server_list"], data
            assert [d for d in data["daemons"] if d["kind"] == "server"], data
        finally:
            holder.communicate(input="", timeout=60)
        assert holder.returncode == 0

        # 3 GiB does not: the pinned device memory limit turns it into a CUDA OOM.
        big = subprocess.run(
            [sys.executable, "-c", CLIENT, str(3 * GiB)],
            env=_client_env(pipe),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert big.returncode == 3, big.stdout + big.stderr
        assert "out of memory" in big.stdout.lower()
    finally:
        stopped = _cli("mps", "stop", "--pipe-dir", str(pipe), "--yes")
        if started.returncode == 0:
            assert stopped.returncode == 0, stopped.stderr
    assert not read_mps_state().for_pipe_dir(str(pipe)).controls
