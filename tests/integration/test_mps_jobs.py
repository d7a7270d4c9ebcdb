"""``submit --mps`` end to end on the simulated backend: the daemon starts a (simulated)
MPS control daemon for the job's user and GPUs, the job runs as its client with the
pinned device memory limit of its budget plus the CUDA context allowance, an allocation
past that limit is the CUDA OOM the real MPS gives, and the control daemon is quit once
no MPS job uses it. The real MPS is covered by tests/gpu/test_policies_gpu.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.mps.state import MpsDaemon, read_mps_state
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import EXAMPLES, PY, Daemon, contexts_measured, start_daemon

GiB = 1 << 30
MiB = 1 << 20
CONTEXT = 512 * MiB  # the allowance: context_memory in the config below

# Says the MPS limit it was given, then runs the simulated CUDA job on the rest of argv.
SHOW_LIMIT = (
    'echo "limit=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT visible=$CUDA_VISIBLE_DEVICES"; exec "$@"'
)


def sim_job(*args: str) -> list[str]:
    return ["sh", "-c", SHOW_LIMIT, "sh", PY, "-m", "gpuwarden.sim.job", *args]


def controls(d: Daemon) -> list[MpsDaemon]:
    """The MPS control daemons that run under this daemon's home."""
    return [c for c in read_mps_state().controls if str(d.home) in (c.pipe_dir or "")]


@pytest.fixture
def mps_daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from _mps_daemon(tmp_path, 'context_memory = "512M"\n')


@pytest.fixture
def measured_mps_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """No context_memory: 512, 512 and 768 MiB measured on this GPU model already."""
    yield from _mps_daemon(tmp_path, "", contexts_measured(512, 512, 768))


def _mps_daemon(
    tmp_path: Path, config: str, prepare: Callable[[Path], None] | None = None
) -> Iterator[Daemon]:
    gen = start_daemon(
        tmp_path, EXAMPLES / "idle-2gpu.json", 'retry_backoff = "200ms"\n' + config, prepare
    )
    d = next(gen)
    try:
        yield d
    finally:
        # MPS daemons outlive the job daemon by design: a test leaves none behind.
        for c in read_mps_state().daemons:
            if str(d.home) in (c.pipe_dir or ""):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGKILL)
        with contextlib.suppress(StopIteration):
            next(gen)


def test_an_mps_job_runs_as_a_client_of_its_own_control_daemon(mps_daemon: Daemon) -> None:
    d = mps_daemon
    jid = d.submit(
        "--mps",
        "--mem",
        "2G",
        "--sm-percent",
        "50",
        "--gpu-ids",
        "1",
        cmd=sim_job("--mem", "1G", "--seconds", "8"),
    )
    d.wait_state(jid, "running")
    gpus: dict[int, Any] = {}

    def client_listed() -> bool:  # one status document for every check below
        gpus.clear()
        gpus.update({g["index"]: g for g in d.json("status")["gpus"]})
        return any(
            p["pid"] != 0 and "mps" in p.get("kinds", [])
            for g in gpus.values()
            for p in g["processes"]
        )

    wait_for(client_listed, timeout=30, interval=0.1, what="the job's client to allocate")
    (control,) = controls(d)
    assert control.visible_devices == "1" and control.uid == os.geteuid()
    servers = [s for s in read_mps_state().servers if str(d.home) in (s.pipe_dir or "")]
    assert len(servers) == 1  # started when its first client connected
    # The client sees its server's GPU as device 0: its memory is on GPU 1, not GPU 0.
    (client,) = [p for p in gpus[1]["processes"] if "mps" in p.get("kinds", [])]
    assert client["memory"] == 1 * GiB + CONTEXT
    assert gpus[1]["mps"] and not gpus[0]["mps"]
    # The server is listed with its own memory on the GPU it serves, as NVML lists it.
    assert [p["memory"] for p in gpus[1]["processes"] if p["pid"] == servers[0].pid] == [66 * MiB]
    assert not [p for p in gpus[0]["processes"] if p["memory"]]
    assert d.cli("wait", str(jid), timeout=60).returncode == 0
    out = (d.home / "jobs" / str(jid) / "attempt-0" / "stdout").read_text()
    assert "limit=0=2560M visible=0" in out  # budget + the CUDA context allowance
    job = d.job(jid)
    assert job["state"] == "succeeded"
    assert job["enforcement"]["hard"].startswith("MPS pinned device memory limit, 50% of SMs")
    wait_for(
        lambda: not controls(d), timeout=30, interval=0.1, what="the MPS control daemon to quit"
    )
    assert not [s for s in read_mps_state().servers if str(d.home) in (s.pipe_dir or "")]


def test_an_mps_clients_limit_allows_the_contexts_measured_on_its_gpu_model(
    measured_mps_daemon: Daemon,
) -> None:
    """Booked the median context (512 MiB), limited at its budget and the upper quartile
    (768 MiB), as the watchdog judges it: contexts differ by the kernels a job loads."""
    d = measured_mps_daemon
    jid = d.submit("--mps", "--mem", "2G", cmd=sim_job("--mem", "1G", "--seconds", "0.5"))
    assert d.cli("wait", str(jid), timeout=60).returncode == 0
    assert d.job(jid)["context"] == 512 * MiB
    out = (d.home / "jobs" / str(jid) / "attempt-0" / "stdout").read_text()
    assert "limit=0=2816M" in out, out


def test_an_mps_client_past_its_limit_fails_with_a_cuda_oom(mps_daemon: Daemon) -> None:
    d = mps_daemon
    neighbour = d.submit(
        "--mps", "--mem", "2G", "--gpu-ids", "0", cmd=sim_job("--mem", "1G", "--seconds", "12")
    )
    d.wait_state(neighbour, "running")
    # Past the PyTorch cap (as allocations outside PyTorch are), the MPS limit stands:
    # 2 GiB + 512 MiB for the whole client, its 512 MiB context inside it.
    greedy = d.submit(
        "--mps",
        "--mem",
        "2G",
        "--gpu-ids",
        "0",
        "--retries",
        "0",
        cmd=[
            "env",
            "-u",
            "GPUWARDEN_MEM_LIMIT",
            *sim_job("--mem", "1G", "--grow-to", "3G", "--seconds", "2"),
        ],
    )
    assert d.cli("wait", str(greedy), timeout=60).returncode != 0
    g = d.job(greedy)
    err = (d.home / "jobs" / str(greedy) / "attempt-0" / "stderr").read_text()
    assert g["state"] == "failed" and "CUDA out of memory. Tried to allocate 2.00 GiB" in err
    assert "oom" in [e["kind"] for e in g["events"]]
    assert len(controls(d)) == 1  # both jobs are one user's on one GPU: one daemon
    assert d.job(neighbour)["state"] == "running"  # its memory and server untouched
    assert d.cli("wait", str(neighbour), timeout=60).returncode == 0
    wait_for(
        lambda: not controls(d), timeout=30, interval=0.1, what="the MPS control daemon to quit"
    )


def test_the_simulated_control_answers_as_mps_does(tmp_path: Path) -> None:
    import subprocess

    from gpuwarden.mps.control import MpsControl
    from gpuwarden.sim import mps

    binary = mps.install(tmp_path / "bin")
    assert Path(binary).name == "nvidia-cuda-mps-control"
    c = MpsControl(str(tmp_path / "p"), str(tmp_path / "l"), binary=binary)
    r = subprocess.run(
        [binary],
        input="get_server_list\n",
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": c.pipe_dir},
        timeout=30,
    )
    assert r.returncode == 1 and "Cannot find MPS control daemon process" in r.stderr
    daemon = c.start(visible_devices=[1], mem_limits={1: 2 * GiB})
    try:
        assert daemon.kind == "control" and daemon.visible_devices == "1"
        assert c.query("get_default_device_pinned_mem_limit 0") == "2048M"
        assert c.query("get_server_list") == ""  # no client yet, no server
        hello = json.loads(mps.ask(c.pipe_dir, f"{mps.HELLO} {os.getpid()}"))
        assert hello["devices"] == "1" and hello["limits"] == {"0": 2 * GiB}
        (server,) = read_mps_state().for_pipe_dir(c.pipe_dir).servers
        assert c.query("get_server_list") == str(server.pid)
        assert c.query(f"get_client_list {server.pid}") == str(os.getpid())
        with pytest.raises(Exception, match="already uses pipe dir"):
            c.start()
    finally:
        stopped = c.stop()
    assert [s.pid for s in stopped] == [daemon.pid]
    assert not read_mps_state().for_pipe_dir(c.pipe_dir).daemons and not c.reachable()
