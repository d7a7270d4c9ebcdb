"""MPS facts and plans: parsing and formatting of limits, the daemon's environment, and
read_mps_state against real processes that carry MPS names and environments."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.errors import UsageError
from gpuwarden.mps.control import MpsConfig, MpsControl
from gpuwarden.mps.limits import (
    check_thread_percentage,
    format_mem_limits,
    format_mps_size,
    parse_gpu_list,
    parse_mem_limit,
    parse_mem_limits,
    parse_server_list,
)
from gpuwarden.mps.state import (
    DEFAULT_LOG_DIR,
    DEFAULT_PIPE_DIR,
    MpsDaemon,
    MpsError,
    MpsState,
    MpsUnavailable,
    daemon_from_env,
    daemon_kind,
    read_mps_state,
)
from gpuwarden.units import GiB, MiB, parse_size
from tests.helpers.procs import nobody_prefix

SRC = Path(__file__).resolve().parents[2] / "src"

# -- names and environments ------------------------------------------------------


def test_daemon_kind_prefers_argv0_over_the_truncated_process_name() -> None:
    # The kernel keeps 15 characters of the name: both daemons read "nvidia-cuda-mps".
    assert daemon_kind("nvidia-cuda-mps", ["/usr/bin/nvidia-cuda-mps-control", "-d"]) == "control"
    assert daemon_kind("nvidia-cuda-mps", ["nvidia-cuda-mps-server"]) == "server"
    assert daemon_kind("nvidia-cuda-mps-control", None) == "control"
    assert daemon_kind("nvidia-cuda-mps", None) is None
    assert daemon_kind("python3", ["python3", "nvidia-cuda-mps-control"]) is None
    assert daemon_kind(None, []) is None


def test_daemon_from_env_defaults_and_unreadable() -> None:
    d = daemon_from_env(7, "control", {}, user="root", uid=0)
    assert (d.pipe_dir, d.log_dir) == (DEFAULT_PIPE_DIR, DEFAULT_LOG_DIR)
    assert d.visible_devices is None and d.pinned_mem_limit is None
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps/a",
        "CUDA_MPS_LOG_DIRECTORY": "/var/log/a",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    d = daemon_from_env(8, "server", env)
    assert (d.pipe_dir, d.log_dir, d.visible_devices) == ("/run/mps/a", "/var/log/a", "2,3")
    assert (d.pinned_mem_limit, d.active_thread_percentage) == ("0=2G", "25")
    unknown = daemon_from_env(9, "control", None, user="alice", uid=1000)
    assert unknown.pipe_dir is None and unknown.log_dir is None and unknown.user == "alice"
    assert set(unknown.to_json()) >= {"pid", "kind", "user", "pipe_dir", "pinned_mem_limit"}


def test_state_filters_by_pipe_dir_spelling() -> None:
    state = MpsState(
        (
            MpsDaemon(1, "control", pipe_dir="/tmp/a"),
            MpsDaemon(2, "server", pipe_dir="/tmp/a/"),
            MpsDaemon(3, "control", pipe_dir="/tmp/b"),
            MpsDaemon(4, "control"),  # environ unreadable: belongs to no known dir
            MpsDaemon(5, "control", pipe_dir="/tmp/../tmp/a"),
        )
    )
    assert [d.pid for d in state.for_pipe_dir("/tmp/a").daemons] == [1, 2, 5]
    assert [d.pid for d in state.for_pipe_dir("/tmp/a").servers] == [2]
    assert state.pipe_dirs == ("/tmp/a", "/tmp/b")


# -- sizes, limits, lists ----------------------------------------------------------


def test_format_mps_size() -> None:
    assert format_mps_size(2 * GiB) == "2G"
    assert format_mps_size(1536 * MiB) == "1536M"
    assert format_mps_size(parse_size("1.5G")) == "1536M"
    for bad in (0, -GiB, MiB + 1):
        with pytest.raises(UsageError):
            format_mps_size(bad)


@given(st.integers(min_value=1, max_value=1 << 24))
def test_format_mps_size_round_trips_through_parse_size(mib: int) -> None:
    assert parse_size(format_mps_size(mib * MiB)) == mib * MiB


def test_parse_mem_limit() -> None:
    assert parse_mem_limit("0=2G") == (0, 2 * GiB)
    assert parse_mem_limit(" 3 = 512MiB ") == (3, 512 * MiB)
    for bad in ("2G", "x=2G", "0=", "=2G", "-1=2G", "0=abc", "0=0", "0=0.5", "0=100"):
        with pytest.raises(UsageError) as e:
            parse_mem_limit(bad)
        assert "\n" not in str(e.value) and "--mem-limit" in str(e.value)


def test_parse_mem_limits_and_format() -> None:
    limits = parse_mem_limits(["1=4G", "0=2G"])
    assert limits == {0: 2 * GiB, 1: 4 * GiB}
    assert format_mem_limits(limits) == "0=2G,1=4G"
    with pytest.raises(UsageError, match="twice"):
        parse_mem_limits(["0=2G", "0=3G"])


def test_thread_percentage_bounds() -> None:
    assert check_thread_percentage(1) == 1
    assert check_thread_percentage(100) == 100
    for bad in (0, 101, -5):
        with pytest.raises(UsageError, match="1-100"):
            check_thread_percentage(bad)


def test_parse_gpu_list() -> None:
    assert parse_gpu_list("0,1") == (0, 1)
    assert parse_gpu_list(" 3 , 1") == (3, 1)  # order is CUDA_VISIBLE_DEVICES order
    for bad in ("", "a", "0,,1", "0,0", "-1"):
        with pytest.raises(UsageError):
            parse_gpu_list(bad)


def test_parse_server_list() -> None:
    assert parse_server_list("") == []
    assert parse_server_list("123\n456\n") == [123, 456]
    assert parse_server_list("Cannot find MPS control daemon process") is None


# -- the plan ------------------------------------------------------------------------


def test_config_env_renumbers_limits_to_the_daemons_devices() -> None:
    cfg = MpsConfig(
        pipe_dir="/run/p",
        log_dir="/run/l",
        visible_devices=(2, 3),
        mem_limits={3: 2 * GiB},
        thread_percentage=50,
    )
    assert cfg.ordinal(3) == 1
    assert cfg.env_overrides() == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/p",
        "CUDA_MPS_LOG_DIRECTORY": "/run/l",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=2G",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    assert cfg.limit_commands() == [
        "set_default_device_pinned_mem_limit 1 2G",
        "set_default_active_thread_percentage 50",
    ]


def test_config_env_drops_inherited_mps_and_device_variables() -> None:
    base = {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_MPS_PIPE_DIRECTORY": "/elsewhere",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G",
    }
    env = MpsConfig(pipe_dir="/run/p").env(base)
    assert env["PATH"] == "/usr/bin"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/p"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    lines = MpsConfig(pipe_dir="/run/p").shell_lines(current_env=base)
    assert lines[0] == "mkdir -p /run/p /var/log/nvidia-mps"
    unset = lines[1].split(" CUDA_DEVICE_ORDER=")[0].split()
    assert unset[0] == "env"
    assert sorted(unset[1:]) == [
        "-u",
        "-u",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_VISIBLE_DEVICES",
    ]
    assert lines[1].endswith(" nvidia-cuda-mps-control -d")
    assert len(lines) == 2  # no limits, no control commands


def test_config_shell_lines_quote_paths() -> None:
    cfg = MpsConfig(pipe_dir="/tmp/a b", mem_limits={0: GiB})
    lines = cfg.shell_lines(current_env={})
    assert "CUDA_MPS_PIPE_DIRECTORY='/tmp/a b'" in lines[1]
    assert lines[2] == (
        "echo 'set_default_device_pinned_mem_limit 0 1G' | "
        "CUDA_MPS_PIPE_DIRECTORY='/tmp/a b' nvidia-cuda-mps-control"
    )


def test_config_rejects_limits_outside_its_gpus() -> None:
    with pytest.raises(UsageError, match="not among"):
        MpsConfig(visible_devices=(1,), mem_limits={0: GiB})
    with pytest.raises(UsageError):
        MpsConfig(thread_percentage=0)


# -- control without a daemon ---------------------------------------------------------


def test_missing_binary_is_one_line(tmp_path: Path) -> None:
    c = MpsControl(str(tmp_path / "p"), binary="gpuwarden-test-no-such-mps-control")
    with pytest.raises(MpsUnavailable) as e:
        c.executable()
    assert "not found" in str(e.value) and "\n" not in str(e.value)


def test_query_and_stop_without_a_daemon(tmp_path: Path) -> None:
    c = MpsControl(str(tmp_path / "p"))
    with pytest.raises(UsageError):
        c.query("get_server_list\nquit")
    with pytest.raises(MpsError, match="no MPS control daemon listens"):
        c.query("get_server_list")
    with pytest.raises(UsageError, match="no MPS control daemon runs"):
        c.stop()


def test_start_reports_a_failing_binary(tmp_path: Path) -> None:
    false = shutil.which("false")
    if false is None:
        pytest.skip("no false(1)")
    c = MpsControl(str(tmp_path / "p"), str(tmp_path / "l"), binary=false)
    with pytest.raises(MpsError, match=r"-d failed \(exit 1\)"):
        c.start()


def test_start_times_out_when_no_daemon_appears(tmp_path: Path) -> None:
    true = shutil.which("true")
    if true is None:
        pytest.skip("no true(1)")
    c = MpsControl(str(tmp_path / "p"), str(tmp_path / "l"), binary=true, timeout=0.3)
    with pytest.raises(MpsError, match=r"did not come up within 0\.3s") as e:
        c.start()
    assert str(tmp_path / "l" / "control.log") in str(e.value)
    assert (tmp_path / "p").is_dir() and (tmp_path / "l").is_dir()


# -- read_mps_state against real processes ------------------------------------------


@pytest.fixture
def mps_lookalikes(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], ...]]:
    """A sleeping Python whose argv[0] is nvidia-cuda-mps-control (with an MPS
    environment) and one named nvidia-cuda-mps-server (with none)."""
    sleep = ["-c", "import time; time.sleep(60)"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    control_env = {
        **base,
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
    }
    procs = (
        subprocess.Popen(
            ["nvidia-cuda-mps-control", *sleep], executable=sys.executable, env=control_env
        ),
        subprocess.Popen(
            ["/usr/bin/nvidia-cuda-mps-server", *sleep], executable=sys.executable, env=base
        ),
        subprocess.Popen(["not-mps", *sleep], executable=sys.executable, env=control_env),
    )
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_read_mps_state_finds_daemons_and_their_environment(
    mps_lookalikes: tuple[subprocess.Popen[bytes], ...], tmp_path: Path
) -> None:
    control, server, other = mps_lookalikes
    state = read_mps_state()
    mine = {d.pid: d for d in state.daemons}
    assert other.pid not in mine
    c, s = mine[control.pid], mine[server.pid]
    assert c.kind == "control" and s.kind == "server"
    assert c.uid == os.getuid() and c.user is not None and c.start_time is not None
    assert c.pipe_dir == str(tmp_path / "pipe") and c.log_dir == str(tmp_path / "log")
    assert (c.visible_devices, c.pinned_mem_limit, c.active_thread_percentage) == (
        "1",
        "0=2G",
        "40",
    )
    assert (s.pipe_dir, s.log_dir, s.visible_devices) == (DEFAULT_PIPE_DIR, DEFAULT_LOG_DIR, None)
    assert [d.pid for d in state.for_pipe_dir(str(tmp_path / "pipe")).controls] == [control.pid]


def test_read_mps_state_without_root_leaves_directories_unknown(
    mps_lookalikes: tuple[subprocess.Popen[bytes], ...],
) -> None:
    drop = nobody_prefix()
    if drop is None:
        pytest.skip("needs root and setpriv or runuser to look as another user")
    control = mps_lookalikes[0]
    code = (
        "import json; from gpuwarden.mps.state import read_mps_state; "
        "print(json.dumps([d.to_json() for d in read_mps_state().daemons]))"
    )
    r = subprocess.run(
        [*drop, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    seen = {d["pid"]: d for d in json.loads(r.stdout)}
    d = seen[control.pid]
    assert d["kind"] == "control" and d["user"] == "root"
    assert d["pipe_dir"] is None and d["pinned_mem_limit"] is None


def test_job_client_env_renumbers_devices_and_sets_the_limit() -> None:
    from gpuwarden.daemon.mps_jobs import client_env, key

    control = MpsControl("/var/lib/gpuwarden/mps/1000-2_5/p", "/var/lib/gpuwarden/mps/1000-2_5/l")
    env = client_env(control, (5, 2), 14 << 30, 30)
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": "/var/lib/gpuwarden/mps/1000-2_5/p",
        "CUDA_MPS_LOG_DIRECTORY": "/var/lib/gpuwarden/mps/1000-2_5/l",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=14G,1=14G",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    assert key(1000, (5, 2)) == "1000-2_5"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in client_env(control, (0,), 1 << 30, None)


def test_pool_refuses_a_pipe_dir_too_long_for_unix_sockets(tmp_path: Path) -> None:
    from gpuwarden.daemon.mps_jobs import MpsJobError, MpsPool

    pool = MpsPool(tmp_path / ("x" * 120))
    with pytest.raises(MpsJobError, match="too long"):
        pool.ensure(os.geteuid(), os.getegid(), (0,))
