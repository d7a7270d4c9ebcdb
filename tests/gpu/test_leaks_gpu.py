"""status, leaks and reap against the real driver: a torch process shows up with its pid,
user and memory; an orphaned grandchild holding CUDA memory is found, reaped, and the
memory is verified back. Run on a GPU machine: ``pytest -m gpu tests/gpu``."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.procs import end_process

GiB = 1 << 30
SRC = str(Path(__file__).resolve().parents[2] / "src")
ALLOC = (
    "import torch, time, sys; x = torch.empty({n}, dtype=torch.uint8, device='cuda'); "
    "torch.cuda.synchronize(); print('ready', flush=True); time.sleep({secs})"
)


def _env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "GPUWARDEN_SIM")
    }
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


def _cli(*args: str) -> Any:
    r = subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args, "--json"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def _gpu0_listed(pid: int) -> dict[str, Any] | None:
    for p in _cli("status")["gpus"][0]["processes"]:
        if p["pid"] == pid:
            return dict(p)
    return None


@pytest.mark.gpu
def test_torch_process_shows_with_pid_user_and_memory() -> None:
    pytest.importorskip("torch")
    p = subprocess.Popen(
        [sys.executable, "-c", ALLOC.format(n=2 * GiB, secs=60)],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        seen = _gpu0_listed(p.pid)
        assert seen is not None, "torch process not listed"
        assert seen["user"] == getpass.getuser()
        assert seen["memory"] >= 2 * GiB
        assert seen["state"] == "running"
        assert "python" in seen["command"]
        leaks = _cli("leaks", "--samples", "2", "--interval", "0.2")["leaks"]
        assert not [lk for lk in leaks if lk["pid"] == p.pid], leaks
    finally:
        end_process(p)


@pytest.mark.gpu
def test_orphaned_grandchild_is_found_and_reaped_with_memory_back() -> None:
    pytest.importorskip("torch")
    code = ALLOC.format(n=3 * GiB, secs=300)
    leader = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "{code}" >/dev/null 2>&1 & echo $!'],
        env=_env(),
        capture_output=True,
        text=True,
        start_new_session=True,
        check=True,
    )
    worker = int(leader.stdout.strip())
    try:
        deadline = time.monotonic() + 60
        while True:
            seen = _gpu0_listed(worker)
            if seen and seen["memory"] >= 3 * GiB:
                break
            assert time.monotonic() < deadline, "orphan never showed its memory"
            time.sleep(0.5)
        assert seen["state"] == "orphan"
        leaks = _cli("leaks", "--samples", "2", "--interval", "0.2")["leaks"]
        [leak] = [lk for lk in leaks if lk["pid"] == worker]
        assert leak["kind"] == "orphan" and leak["memory"] >= 3 * GiB

        before = _cli("status")["gpus"][0]["memory_used"]
        out = _cli("reap", "--yes", "--pid", str(worker), "--samples", "1", "--grace", "5")
        [action] = [a for a in out["actions"] if a["pid"] == worker]
        assert action["action"] == "terminate"
        assert action["result"] in ("terminated", "killed")
        [back] = out["reclaimed"]
        print(f"reclaimed {back['bytes'] / GiB:.2f} GiB in {back['seconds']} s")
        assert back["bytes"] >= 3 * GiB and back["seconds"] is not None
        assert out["still_held"] == []
        after = _cli("status")["gpus"][0]["memory_used"]
        assert before - after >= 3 * GiB
        # Gone, or a zombie under an init that does not reap: either way it has exited.
        assert (
            not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
        )
    finally:
        if psutil.pid_exists(worker):
            os.kill(worker, signal.SIGKILL)


FORKED = (
    "import os, sys, time, torch\n"
    "x = torch.empty({n}, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.close(1); os.close(2)  # let the test read the parent's output to its end\n"
    "    time.sleep(300)  # the child inherited the device files and libcuda, not the context\n"
    "    os._exit(0)\n"
    "print(pid, flush=True)\n"
    "os._exit(0)  # the parent dies at once: no clean CUDA teardown\n"
)


@pytest.mark.gpu
def test_forked_child_of_a_dead_cuda_process_is_a_hidden_holder_and_reaped() -> None:
    """The classic leak: a worker forked after CUDA init outlives its parent and keeps the
    device files open; NVML lists no live process for it."""
    pytest.importorskip("torch")
    baseline = _cli("status")["gpus"][0]["memory_used"]
    r = subprocess.run(
        [sys.executable, "-c", FORKED.format(n=2 * GiB)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    child = int(r.stdout.strip())
    try:
        leaks = _cli("leaks", "--samples", "2", "--interval", "0.5")["leaks"]
        print(json.dumps(leaks, indent=1))
        mine = [lk for lk in leaks if lk["pid"] == child]
        assert mine and mine[0]["kind"] == "hidden_holder", leaks
        assert "CUDA context" in mine[0]["evidence"]
        out = _cli("reap", "--yes", "--pid", str(child), "--samples", "1", "--timeout", "30")
        print(json.dumps(out, indent=1))
        [action] = [a for a in out["actions"] if a["pid"] == child]
        assert action["action"] == "terminate"
        assert action["result"] in ("terminated", "killed")
        deadline = time.monotonic() + 30
        while _cli("status")["gpus"][0]["memory_used"] > baseline + 64 * 2**20:
            assert time.monotonic() < deadline, "memory did not come back"
            time.sleep(0.5)
    finally:
        if psutil.pid_exists(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.gpu
def test_an_nvml_only_process_is_a_monitor_not_a_hidden_holder() -> None:
    code = "import pynvml, time; pynvml.nvmlInit(); print('ready', flush=True); time.sleep(60)"
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        leaks = _cli("leaks", "--samples", "1")["leaks"]
        mine = [lk for lk in leaks if lk["pid"] == p.pid]
        assert [lk["kind"] for lk in mine] == ["monitor"], leaks
    finally:
        end_process(p)
