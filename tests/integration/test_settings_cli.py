"""``gpuwarden gpu mode`` and ``gpuwarden mps`` as real subprocesses: dry runs, --yes on
the simulated backend, one-line errors, the root refusal on the real backend, and the
MPS control plumbing against a stand-in ``nvidia-cuda-mps-control``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.mps.control import MpsControl
from gpuwarden.mps.state import MpsError, read_mps_state
from tests.helpers.procs import nobody_prefix

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
EXAMPLES = ROOT / "examples"
CMD = [sys.executable, "-m", "gpuwarden"]


def _env(
    state: Path | None, scenario: str | None = "idle-2gpu.json", **extra: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_"))}
    env.update(PYTHONPATH=str(SRC), COLUMNS="200")
    if scenario is not None:
        env["GPUWARDEN_SIM"] = str(EXAMPLES / scenario)
    if state is not None:
        env["GPUWARDEN_SIM_STATE"] = str(state)
    env.update(extra)
    return env


def run(
    *args: str, env: dict[str, str], as_nobody: bool = False, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    prefix: list[str] = []
    if as_nobody:
        drop = nobody_prefix()
        assert drop is not None
        prefix = list(drop)
    return subprocess.run(
        [*prefix, *CMD, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


needs_nobody = pytest.mark.skipif(
    nobody_prefix() is None, reason="needs root and setpriv or runuser"
)


def one_line_error(r: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert the run failed with ``code`` and exactly one 'gpuwarden: error:' line."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuwarden: error: "), r.stderr
    return lines[0]


def gpu_fields(env: dict[str, str], field: str) -> dict[int, Any]:
    r = run("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return {g["index"]: g[field] for g in json.loads(r.stdout)["gpus"]}


def _nvml_unavailable() -> bool:
    from gpuwarden.errors import BackendUnavailable
    from gpuwarden.gpus.nvml import NvmlBackend

    try:
        NvmlBackend.open().close()
    except BackendUnavailable:
        return True
    return False


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A temporary directory that nobody can use too (pytest's tmp_path is root's)."""
    d = Path(tempfile.mkdtemp(prefix="gw-settings-"))
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- gpu mode -----------------------------------------------------------------------


def test_gpu_mode_dry_run_prints_the_change_and_changes_nothing(tmp_path: Path) -> None:
    env = _env(tmp_path)
    r = run("gpu", "mode", "1", "exclusive", env=env)
    assert r.returncode == 0, r.stderr
    assert (
        "GPU 1: compute mode Default -> Exclusive_Process (dry run; add --yes to apply)" in r.stdout
    )
    assert "nvidia-smi -i 1 -c EXCLUSIVE_PROCESS" in r.stdout
    assert gpu_fields(env, "compute_mode") == {0: "Default", 1: "Default"}


def test_gpu_mode_yes_on_the_sim_applies_and_reads_back(tmp_path: Path) -> None:
    env = _env(tmp_path)
    r = run("gpu", "mode", "1", "EXCLUSIVE", "--yes", env=env)
    assert r.returncode == 0, r.stderr
    assert "GPU 1: compute mode Default -> Exclusive_Process\n" in r.stdout
    assert "dry run" not in r.stdout
    assert gpu_fields(env, "compute_mode") == {0: "Default", 1: "Exclusive_Process"}

    again = run("gpu", "mode", "1", "exclusive", "--yes", env=env)
    assert again.returncode == 0 and "already Exclusive_Process" in again.stdout

    r = run("gpu", "mode", "1", "prohibited", "--yes", env=env)
    assert "Exclusive_Process -> Prohibited" in r.stdout
    r = run("gpu", "mode", "1", "default", "--yes", env=env)
    assert r.returncode == 0 and "Prohibited -> Default" in r.stdout
    assert gpu_fields(env, "compute_mode") == {0: "Default", 1: "Default"}


@needs_nobody
def test_gpu_mode_on_the_sim_needs_no_root(shared_dir: Path) -> None:
    env = _env(shared_dir / "state")
    r = run("gpu", "mode", "0", "prohibited", "--yes", env=env, as_nobody=True)
    assert r.returncode == 0, r.stderr
    assert gpu_fields(env, "compute_mode")[0] == "Prohibited"


def test_gpu_mode_unknown_index_is_one_line(tmp_path: Path) -> None:
    for extra in ([], ["--yes"]):
        line = one_line_error(run("gpu", "mode", "7", "default", *extra, env=_env(tmp_path)), 2)
        assert "no GPU with index 7" in line


def test_gpu_mode_unknown_mode_is_a_choice_error(tmp_path: Path) -> None:
    r = run("gpu", "mode", "0", "shared", env=_env(tmp_path))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "'shared' is not one of 'default', 'exclusive', 'prohibited'" in r.stderr


def test_gpu_mode_warns_about_other_users_processes(tmp_path: Path) -> None:
    env = _env(tmp_path, "a100x8-shared.json")
    r = run("gpu", "mode", "6", "exclusive", env=env)
    assert r.returncode == 0, r.stderr
    assert "warning: GPU 6 has processes of other users (alice, llm)" in r.stderr
    quiet = run("gpu", "mode", "4", "exclusive", env=env)  # idle GPU: nothing to warn
    assert quiet.returncode == 0 and quiet.stderr == ""
    back = run("gpu", "mode", "6", "default", env=env)  # Default takes nothing away
    assert back.returncode == 0 and "already Default" in back.stdout and back.stderr == ""


@needs_nobody
def test_gpu_mode_real_backend_refuses_non_root_before_nvml() -> None:
    line = one_line_error(
        run(
            "gpu", "mode", "0", "exclusive", "--yes", env=_env(None, scenario=None), as_nobody=True
        ),
        4,
    )
    assert "needs root" in line and "NVML" not in line


@pytest.mark.skipif(os.geteuid() != 0, reason="root gets past the root check")
def test_gpu_mode_real_backend_as_root_reaches_nvml() -> None:
    if not _nvml_unavailable():
        pytest.skip("NVML works here; this test is about a machine without it")
    line = one_line_error(
        run("gpu", "mode", "0", "exclusive", "--yes", env=_env(None, scenario=None)), 3
    )
    assert "NVML is not available" in line


# -- mps on the simulated backend ----------------------------------------------------


def test_mps_start_dry_run_prints_commands_and_env(tmp_path: Path) -> None:
    env = _env(tmp_path)
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    r = run(
        "mps",
        "start",
        "--pipe-dir",
        str(pipe),
        "--log-dir",
        str(logs),
        "--mem-limit",
        "0=2G",
        "--mem-limit",
        "1=4G",
        "--thread-percentage",
        "50",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "dry run; add --yes to apply" in out
    start = next(line for line in out.splitlines() if line.strip().startswith("env "))
    for part in (
        f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
        f"CUDA_MPS_LOG_DIRECTORY={logs}",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G,1=4G",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
    ):
        assert part in start.split(), part
    assert start.endswith("nvidia-cuda-mps-control -d")
    assert "CUDA_VISIBLE_DEVICES=" not in start
    assert (
        f"echo 'set_default_device_pinned_mem_limit 1 4G' | CUDA_MPS_PIPE_DIRECTORY={pipe} "
        "nvidia-cuda-mps-control"
    ) in out
    assert "set_default_active_thread_percentage 50" in out
    assert f"clients: set CUDA_MPS_PIPE_DIRECTORY={pipe}" in out
    assert not pipe.exists() and not logs.exists()
    assert gpu_fields(env, "mps") == {0: False, 1: False}


def test_mps_start_dry_run_renumbers_limits_for_the_chosen_gpus(tmp_path: Path) -> None:
    r = run("mps", "start", "--gpus", "1", "--mem-limit", "1=2G", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "CUDA_VISIBLE_DEVICES=1 " in r.stdout
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G " in r.stdout
    assert "set_default_device_pinned_mem_limit 0 2G" in r.stdout
    assert "GPU 1 is device 0" in r.stdout


def test_mps_start_and_stop_on_the_sim_flip_the_mps_flag(tmp_path: Path) -> None:
    env = _env(tmp_path)
    r = run("mps", "start", "--gpus", "1", "--mem-limit", "1=2G", "--yes", env=env)
    assert r.returncode == 0, r.stderr
    assert "simulated backend" in r.stdout and "nvidia-cuda-mps-control -d" in r.stdout
    assert gpu_fields(env, "mps") == {0: False, 1: True}

    st = run("mps", "status", "--json", env=env)
    assert st.returncode == 0, st.stderr
    data = json.loads(st.stdout)
    assert data["backend"] == "sim"
    assert {g["index"]: g["mps"] for g in data["gpus"]} == {0: False, 1: True}
    table = run("mps", "status", env=env)
    assert table.returncode == 0 and "MPS serving (sim): GPU 1" in table.stdout

    dry = run("mps", "stop", env=env)
    assert dry.returncode == 0 and "dry run" in dry.stdout
    assert gpu_fields(env, "mps") == {0: False, 1: True}
    r = run("mps", "stop", "--yes", env=env)
    assert r.returncode == 0, r.stderr
    assert gpu_fields(env, "mps") == {0: False, 1: False}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mem-limit", "5=2G"], "no GPU with index 5"),
        (["--mem-limit", "0=2X"], "invalid --mem-limit '0=2X'"),
        (["--mem-limit", "0=0G"], "must be positive"),
        (["--mem-limit", "2G"], "use GPU=SIZE"),
        (["--mem-limit", "0=2G", "--mem-limit", "0=1G"], "GPU 0 twice"),
        (["--gpus", "1", "--mem-limit", "0=2G"], "not among the daemon's GPUs"),
        (["--thread-percentage", "0"], "--thread-percentage must be 1-100, got 0"),
        (["--thread-percentage", "101"], "--thread-percentage must be 1-100, got 101"),
        (["--gpus", "0,0"], "named twice"),
        (["--gpus", "4"], "no GPU with index 4"),
    ],
)
def test_mps_start_bad_input_is_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    for extra in ([], ["--yes"]):
        line = one_line_error(run("mps", "start", *args, *extra, env=_env(tmp_path)), 2)
        assert needle in line
    assert gpu_fields(_env(tmp_path), "mps") == {0: False, 1: False}


# -- mps on the real backend -------------------------------------------------------


@needs_nobody
@pytest.mark.parametrize("verb", ["start", "stop"])
def test_mps_real_backend_refuses_non_root(verb: str) -> None:
    line = one_line_error(
        run("mps", verb, "--yes", env=_env(None, scenario=None), as_nobody=True), 4
    )
    assert "needs root" in line


@pytest.mark.skipif(os.geteuid() != 0, reason="root gets past the root check")
def test_mps_missing_binary_is_one_line_before_nvml() -> None:
    env = _env(None, scenario=None, PATH=os.path.dirname(sys.executable))
    if shutil.which("nvidia-cuda-mps-control", path=env["PATH"]):
        pytest.skip("nvidia-cuda-mps-control is installed beside python")
    for verb in ("start", "stop"):
        line = one_line_error(run("mps", verb, "--yes", env=env), 3)
        assert "nvidia-cuda-mps-control not found" in line


@needs_nobody
def test_mps_status_needs_no_root_nor_gpu() -> None:
    r = run("mps", "status", "--json", env=_env(None, scenario=None), as_nobody=True)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"schema", "backend", "daemons", "pipes", "gpus", "warnings"}
    if data["gpus"] is None:
        assert any("NVML" in w for w in data["warnings"])


# -- MpsControl against a stand-in nvidia-cuda-mps-control ---------------------------

FAKE_MPS = '''#!{python}
"""Stand-in for nvidia-cuda-mps-control on machines without a GPU. It keeps the interface
gpuwarden drives (argv, environment, a control endpoint in CUDA_MPS_PIPE_DIRECTORY,
commands on stdin, a child named nvidia-cuda-mps-server), not what MPS does."""
import os, socket, subprocess, sys

PYTHON = "{python}"  # not sys.executable: with argv[0] renamed, Python cannot find itself
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"
control = os.path.join(pipe, "control")

if sys.argv[1:] == ["-d"]:
    if os.fork() == 0:
        os.setsid()
        if not os.environ.get("FAKE_MPS_KEEP_STDIO"):
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
        os.execv(PYTHON, ["nvidia-cuda-mps-control", __file__, "--serve"])
    sys.exit(0)

if sys.argv[1:] == ["--serve"]:
    server = subprocess.Popen(["nvidia-cuda-mps-server", "-c",
                               "import time\\nwhile True: time.sleep(1)"],
                              executable=PYTHON)
    log = open(os.path.join(logs, "control.log"), "a", buffering=1)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(control)
    srv.listen()
    while True:
        conn, _ = srv.accept()
        with conn:
            command = conn.makefile().readline().strip()
            log.write(command + "\\n")
            if command == "get_server_list":
                conn.sendall(f"{{server.pid}}\\n".encode())
            elif command == "quit":
                if os.environ.get("FAKE_MPS_IGNORE_QUIT"):
                    continue
                server.kill()
                server.wait()
                os.unlink(control)
                sys.exit(0)
            elif command.startswith("set_default_"):
                pass
            else:
                conn.sendall(b"unknown command\\n")

s = socket.socket(socket.AF_UNIX)
try:
    s.connect(control)
except OSError:
    sys.stderr.write("Cannot find MPS control daemon process\\n")
    sys.exit(1)
s.sendall(sys.stdin.read().encode())
s.shutdown(socket.SHUT_WR)
sys.stdout.write(s.makefile().read())
'''


@dataclass
class FakeMps:
    root: Path
    bin_dir: Path

    @property
    def binary(self) -> str:
        return str(self.bin_dir / "nvidia-cuda-mps-control")

    def dirs(self, name: str) -> tuple[Path, Path]:
        return self.root / name / "pipe", self.root / name / "log"

    def env(self, **extra: str) -> dict[str, str]:
        env = _env(None, scenario=None, **extra)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def log(self, name: str) -> list[str]:
        return (self.root / name / "log" / "control.log").read_text().splitlines()


@pytest.fixture
def fake_mps() -> Iterator[FakeMps]:
    root = Path(tempfile.mkdtemp(prefix="gw-mps-"))  # short: unix socket paths are short
    root.chmod(0o755)
    bin_dir = root / "bin"
    bin_dir.mkdir(mode=0o755)
    bin_dir.chmod(0o755)  # whatever the umask: nobody runs it in one test
    script = bin_dir / "nvidia-cuda-mps-control"
    # The stand-in needs only the standard library; the system Python is the one that
    # other users (the per-user daemon test) can surely run.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    script.write_text(FAKE_MPS.format(python=python))
    script.chmod(0o755)
    try:
        yield FakeMps(root, bin_dir)
    finally:
        # Whatever a failed test left running under our directories: we started it.
        for d in read_mps_state().daemons:
            if d.pipe_dir is not None and d.pipe_dir.startswith(str(root)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(d.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def test_control_start_query_stop(fake_mps: FakeMps) -> None:
    pipe, logs = fake_mps.dirs("a")
    c = MpsControl(str(pipe), str(logs), binary=fake_mps.binary, timeout=10)
    daemon = c.start(visible_devices=[1], mem_limits={1: 2 << 30}, thread_percentage=30)
    assert daemon.kind == "control" and daemon.pipe_dir == str(pipe)
    assert (daemon.visible_devices, daemon.pinned_mem_limit) == ("1", "0=2G")
    assert daemon.active_thread_percentage == "30"
    assert fake_mps.log("a") == [
        "set_default_device_pinned_mem_limit 0 2G",
        "set_default_active_thread_percentage 30",
    ]
    state = read_mps_state().for_pipe_dir(str(pipe))
    assert [d.pid for d in state.controls] == [daemon.pid]
    (server,) = state.servers  # inherits the daemon's environment, like the real one
    assert c.query("get_server_list") == str(server.pid)

    with pytest.raises(Exception, match="already uses pipe dir"):
        c.start()
    stopped = c.stop()
    assert [d.pid for d in stopped] == [daemon.pid]
    assert not read_mps_state().for_pipe_dir(str(pipe)).daemons
    assert not c.reachable()


def test_control_two_daemons_side_by_side(fake_mps: FakeMps) -> None:
    # The job daemon will run one control daemon per (GPU set, user): no shared paths.
    a = MpsControl(*map(str, fake_mps.dirs("a")), binary=fake_mps.binary)
    b = MpsControl(*map(str, fake_mps.dirs("b")), binary=fake_mps.binary)
    da, db = a.start(visible_devices=[0]), b.start(visible_devices=[1])
    assert da.pid != db.pid
    a.stop()
    assert [d.pid for d in b.daemons()] == [db.pid]
    assert b.query("get_server_list").isdigit()
    b.stop()


def test_control_start_does_not_wait_on_a_daemon_that_keeps_stdout(
    fake_mps: FakeMps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_KEEP_STDIO", "1")
    c = MpsControl(*map(str, fake_mps.dirs("a")), binary=fake_mps.binary, timeout=5)
    c.start()
    c.stop()


def test_control_stop_times_out_with_a_clear_error(
    fake_mps: FakeMps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_IGNORE_QUIT", "1")
    c = MpsControl(*map(str, fake_mps.dirs("a")), binary=fake_mps.binary, timeout=0.5)
    d = c.start()
    with pytest.raises(MpsError, match=rf"pid {d.pid}\) still runs 0\.5s after quit"):
        c.stop()


@needs_nobody
def test_control_runs_a_daemon_as_another_user(fake_mps: FakeMps) -> None:
    pipe, logs = fake_mps.dirs("nobody")
    c = MpsControl(str(pipe), str(logs), binary=fake_mps.binary, uid=65534, gid=65534)
    d = c.start()
    assert (d.uid, d.user) == (65534, "nobody")
    assert pipe.stat().st_uid == 65534 and logs.stat().st_uid == 65534
    assert c.query("get_server_list").isdigit()
    c.stop()


def test_cli_status_and_stop_on_the_real_path(fake_mps: FakeMps) -> None:
    if os.geteuid() != 0:
        pytest.skip("mps stop --yes needs root on the real backend")
    pipe, logs = fake_mps.dirs("cli")
    daemon = MpsControl(str(pipe), str(logs), binary=fake_mps.binary).start(mem_limits={0: 1 << 30})
    env = fake_mps.env()

    r = run("mps", "status", "--json", "--pipe-dir", str(pipe), env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    (control,) = [d for d in data["daemons"] if d["kind"] == "control"]
    (server,) = [d for d in data["daemons"] if d["kind"] == "server"]
    assert control["pid"] == daemon.pid and control["pinned_mem_limit"] == "0=1G"
    assert data["pipes"] == [
        {"pipe_dir": str(pipe), "reachable": True, "server_list": [server["pid"]], "error": None}
    ]
    everything = json.loads(run("mps", "status", "--json", env=env).stdout)
    assert str(pipe) in [p["pipe_dir"] for p in everything["pipes"]]
    table = run("mps", "status", "--pipe-dir", str(pipe), env=env)
    assert table.returncode == 0 and str(daemon.pid) in table.stdout

    dry = run("mps", "stop", "--pipe-dir", str(pipe), env=env)
    assert dry.returncode == 0 and f"would stop MPS control daemon {daemon.pid}" in dry.stdout
    assert read_mps_state().for_pipe_dir(str(pipe)).controls

    r = run("mps", "stop", "--pipe-dir", str(pipe), "--yes", env=env)
    assert r.returncode == 0, r.stderr
    assert f"MPS control daemon stopped ({daemon.pid}" in r.stdout
    assert not read_mps_state().for_pipe_dir(str(pipe)).daemons

    again = run("mps", "stop", "--pipe-dir", str(pipe), "--yes", env=env)
    assert "no MPS control daemon runs" in one_line_error(again, 2)
