"""``gpuwarden select`` and ``gpuwarden exec`` as real subprocesses on the simulated backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gpuwarden
from gpuwarden.hooks.gpuwarden_torch_cap import allowed_bytes
from tests.helpers.wait import wait_for

SRC = Path(gpuwarden.__file__).resolve().parent.parent
REPO = SRC.parent
IDLE = REPO / "examples" / "idle-2gpu.json"
GiB = 1 << 30
UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-00000000-0000-4000-8000-000000000001"

# Prints what a launched command sees: its environment, pid and CPU affinity.
SHOW_ENV = textwrap.dedent("""
    import json, os
    keys = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUWARDEN_MEM_LIMIT",
            "GPUWARDEN_MEM_TOTALS", "PYTHONPATH"]
    print(json.dumps({"env": {k: os.environ.get(k) for k in keys}, "pid": os.getpid(),
                      "cpus": sorted(os.sched_getaffinity(0))}))
""")

Run = Callable[..., subprocess.CompletedProcess[str]]


def scenario(
    tmp_path: Path,
    *,
    busy0: str | None = None,
    util: tuple[int, int] = (0, 0),
    total: str = "24GiB",
) -> Path:
    """Two GPUs like idle-2gpu.json; ``busy0`` memory held on GPU 0 by a foreign process."""
    gpus = [
        {
            "index": i,
            "uuid": u,
            "name": "NVIDIA L4",
            "memory_total": total,
            "numa_node": i,
            "cpus": str(i),
            "utilization": util[i],
        }
        for i, u in enumerate((UUID0, UUID1))
    ]
    data: dict[str, object] = {"gpus": gpus}
    if busy0:
        data["processes"] = [
            {"pid": 4242, "gpu": 0, "user": "bob", "command": "train.py", "memory": busy0}
        ]
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUWARDEN_", "CUDA_")) and k != "PYTHONPATH"
    }
    e.update(
        GPUWARDEN_SIM=str(IDLE), GPUWARDEN_SIM_STATE=str(tmp_path / "state"), PYTHONPATH=str(SRC)
    )
    return e


@pytest.fixture
def gw(env: dict[str, str]) -> Run:
    def run(
        *args: str,
        sim: Path | None = None,
        timeout: float = 60,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        e = dict(env)
        if sim is not None:
            e["GPUWARDEN_SIM"] = str(sim)
        e.update(extra_env or {})
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=e,
            text=True,
            capture_output=True,
            timeout=timeout,
            cwd=REPO,
        )

    return run


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("gpuwarden: error: ")
    return lines[0]


def shown(r: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert r.returncode == 0, r.stderr
    data: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return data


# --- select ------------------------------------------------------------------------------


def test_select_picks_the_free_gpu(gw: Run, tmp_path: Path) -> None:
    r = gw("select", "--mem", "10G", sim=scenario(tmp_path, busy0="20GiB"))
    assert (r.returncode, r.stdout, r.stderr) == (0, "1\n", "")


def test_select_uuid_and_count(gw: Run) -> None:
    assert gw("select", "--mem", "20G").stdout == "0\n"
    assert gw("select", "--mem", "20G", "--uuid").stdout == f"{UUID0}\n"
    assert gw("select", "--mem", "0.5", "--count", "2").stdout == "0,1\n"
    r = gw("select", "--mem", "1G", "--count", "2", "--uuid")
    assert r.stdout == f"{UUID0},{UUID1}\n"


def test_select_json(gw: Run, tmp_path: Path) -> None:
    r = gw("select", "--mem", "10G", "--json", sim=scenario(tmp_path, busy0="20GiB"))
    data = json.loads(r.stdout)
    assert data["cuda_visible_devices"] == "1" and data["gpus"] == [1]
    assert [c["qualifies"] for c in data["considered"]] == [False, True]
    assert data["request"]["memory"] == 10 * GiB


def test_select_max_util(gw: Run, tmp_path: Path) -> None:
    r = gw("select", "--mem", "1G", "--max-util", "30", sim=scenario(tmp_path, util=(90, 20)))
    assert r.stdout == "1\n"


def test_nothing_fits_exits_1_with_the_reasons(gw: Run, tmp_path: Path) -> None:
    r = gw(
        "select",
        "--mem",
        "10G",
        "--max-util",
        "30",
        sim=scenario(tmp_path, busy0="20GiB", util=(0, 50)),
    )
    assert r.returncode == 1 and r.stdout == ""
    line = one_line_error(r)
    assert "GPU 0: 4096MiB free < 10.0GiB" in line and "GPU 1: util 50% > 30%" in line


def test_same_numa_across_nodes_is_a_usage_error(gw: Run) -> None:
    r = gw("select", "--mem", "1G", "--count", "2", "--same-numa")
    assert r.returncode == 2
    assert "NUMA" in one_line_error(r)


@pytest.mark.parametrize(
    ("mem", "words"),
    [
        ("12X", "unknown unit"),
        ("-1G", "invalid size"),
        ("30G", "more than any GPU"),
        ("0G", "positive"),
        ("1.5", "fraction"),
        ("20", "give a unit, e.g. 20G"),
    ],
)
def test_bad_or_impossible_mem_is_one_line_exit_2(gw: Run, mem: str, words: str) -> None:
    for verb in (["select"], ["exec"]):
        r = gw(*verb, "--mem", mem, *(["--", "true"] if verb == ["exec"] else []))
        assert r.returncode == 2, r.stderr
        assert words in one_line_error(r)


def test_more_gpus_than_exist_is_a_usage_error(gw: Run) -> None:
    r = gw("select", "--mem", "1G", "--count", "3")
    assert r.returncode == 2 and "--count 3" in one_line_error(r)


# --- exec --------------------------------------------------------------------------------


def test_exec_sets_the_environment_and_affinity(gw: Run, tmp_path: Path) -> None:
    for busy, gpu in ((None, 0), ("20GiB", 1)):
        sim = scenario(tmp_path, busy0=busy)
        out = shown(gw("exec", "--mem", "2G", "--", sys.executable, "-c", SHOW_ENV, sim=sim))
        env = out["env"]
        assert isinstance(env, dict)
        assert env["CUDA_VISIBLE_DEVICES"] == str(gpu)
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["GPUWARDEN_MEM_LIMIT"] == str(2 * GiB)
        assert env["GPUWARDEN_MEM_TOTALS"] == str(24 * GiB)
        assert str(env["PYTHONPATH"]).split(os.pathsep)[0].endswith("gpuwarden/hooks")
        if {0, 1} <= os.sched_getaffinity(0):
            assert out["cpus"] == [gpu]  # idle-2gpu.json: GPU 0 -> CPU 0, GPU 1 -> CPU 1


def test_exec_two_gpus_gets_both_cpus(gw: Run) -> None:
    out = shown(gw("exec", "--mem", "1G", "--count", "2", "--", sys.executable, "-c", SHOW_ENV))
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"  # type: ignore[index]
    if {0, 1} <= os.sched_getaffinity(0):
        assert out["cpus"] == [0, 1]


def test_exec_no_bind_no_cap(gw: Run) -> None:
    out = shown(
        gw(
            "exec",
            "--mem",
            "1G",
            "--no-cap",
            "--no-bind",
            "--",
            sys.executable,
            "-c",
            SHOW_ENV,
            extra_env={"GPUWARDEN_MEM_LIMIT": "5"},
        )
    )
    env = out["env"]
    assert isinstance(env, dict)
    assert env["GPUWARDEN_MEM_LIMIT"] is None  # an outer cap does not leak in
    assert "hooks" not in str(env["PYTHONPATH"])
    assert out["cpus"] == sorted(os.sched_getaffinity(0))


def test_exec_replaces_itself_with_the_command(gw: Run, env: dict[str, str]) -> None:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "exec",
            "--mem",
            "1G",
            "--",
            sys.executable,
            "-c",
            SHOW_ENV,
        ],
        env=env,
        text=True,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out)["pid"] == p.pid


def test_exec_runs_a_simulated_job(gw: Run) -> None:
    r = gw(
        "exec",
        "--mem",
        "2G",
        "--",
        sys.executable,
        "-m",
        "gpuwarden.sim.job",
        "--mem",
        "2G",
        "--seconds",
        "1",
    )
    assert r.returncode == 0, r.stderr
    assert "ready pid=" in r.stdout and "gpus=0" in r.stdout


def test_exec_cap_stops_a_job_that_asks_for_more(gw: Run) -> None:
    r = gw(
        "exec",
        "--mem",
        "1G",
        "--",
        sys.executable,
        "-m",
        "gpuwarden.sim.job",
        "--mem",
        "2G",
        "--seconds",
        "1",
    )
    assert r.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory" in r.stderr
    assert "1024.00 MiB allowed" in r.stderr  # PyTorch's words for its fraction's cap
    r = gw(
        "exec",
        "--mem",
        "1G",
        "--no-cap",
        "--",
        sys.executable,
        "-m",
        "gpuwarden.sim.job",
        "--mem",
        "2G",
        "--seconds",
        "0",
    )
    assert r.returncode == 0, r.stderr


def test_exec_propagates_the_exit_code(gw: Run) -> None:
    assert (
        gw("exec", "--mem", "1G", "--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7
    )
    r = gw(
        "exec",
        "--mem",
        "1G",
        "--",
        sys.executable,
        "-m",
        "gpuwarden.sim.job",
        "--mem",
        "1G",
        "--seconds",
        "0",
        "--exit-code",
        "3",
    )
    assert r.returncode == 3


def test_exec_unknown_command_is_127(gw: Run, tmp_path: Path) -> None:
    r = gw("exec", "--mem", "1G", "--", "no-such-command-gpuwarden")
    assert r.returncode == 127
    assert "no-such-command-gpuwarden: command not found" in one_line_error(r)
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\n")
    r = gw("exec", "--mem", "1G", "--", str(script))
    assert r.returncode == 126 and "permission denied" in one_line_error(r)
    # Nothing was leased for a command that never ran.
    assert not list((tmp_path / "state" / "leases").glob("*.json"))


def test_exec_arguments_after_the_command_are_its_own(gw: Run) -> None:
    r = gw(
        "exec",
        "--mem",
        "1G",
        sys.executable,
        "-c",
        "import sys; print(sys.argv[1:])",
        "--mem",
        "-v",
    )
    assert r.stdout.strip() == "['--mem', '-v']"


def test_exec_nothing_fits_is_exit_1(gw: Run, tmp_path: Path) -> None:
    r = gw("exec", "--mem", "10G", "--", "true", sim=scenario(tmp_path, busy0="20GiB"))
    assert r.returncode == 0  # GPU 1 is free
    r = gw(
        "exec", "--mem", "10G", "--count", "2", "--", "true", sim=scenario(tmp_path, busy0="20GiB")
    )
    assert r.returncode == 1 and "GPU 0:" in one_line_error(r)


def test_concurrent_execs_land_on_different_gpus(env: dict[str, str]) -> None:
    cmd = [
        sys.executable,
        "-m",
        "gpuwarden",
        "exec",
        "--mem",
        "14G",
        "--",
        sys.executable,
        "-m",
        "gpuwarden.sim.job",
        "--mem",
        "14G",
        "--seconds",
        "3",
    ]
    procs = [
        subprocess.Popen(
            cmd, env=env, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
    gpus = sorted(out.split("gpus=")[1].split()[0] for out, _ in results)
    assert gpus == ["0", "1"]


def test_a_lease_holds_a_gpu_until_its_job_shows_up(gw: Run, env: dict[str, str]) -> None:
    # A job that has not allocated yet still holds its lease: a third 14G exec finds
    # nothing, instead of trusting NVML's stale "24G free" twice.
    slow = [sys.executable, "-c", "import time; time.sleep(4)"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "exec", "--mem", "14G", "--", *slow],
            env=env,
            cwd=REPO,
        )
        for _ in range(2)
    ]
    try:
        leases = Path(env["GPUWARDEN_SIM_STATE"]) / "leases"
        wait_for(
            lambda: sorted(p.name for p in leases.glob("*.json")),
            30,
            0.1,
            until=lambda names: len(names) >= 2,
            what=lambda names: f"the two exec'd jobs' leases, found only {names}",
        )
        r = gw("select", "--mem", "14G")
        assert r.returncode == 1, r.stdout
        assert "leased" in one_line_error(r)
    finally:
        for p in procs:
            p.wait(timeout=60)
    # Their processes are gone: the leases are stale, ignored and pruned.
    assert gw("select", "--mem", "14G", "--count", "2").stdout == "0,1\n"
    assert not list(leases.glob("*.json"))


def test_lease_timeout_expires_a_lease(gw: Run, env: dict[str, str]) -> None:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "exec",
            "--mem",
            "20G",
            "--lease-timeout",
            "1",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(5)",
        ],
        env=env,
        cwd=REPO,
    )
    try:
        time.sleep(2.0)
        # Both GPUs are free again for the policy: GPU 0 wins the tie.
        assert gw("select", "--mem", "20G", "--count", "2").stdout == "0,1\n"
    finally:
        p.kill()
        p.wait()


# --- the torch hook, with a stand-in torch --------------------------------------------------

FAKE_TORCH_INIT = """
from . import cuda
READY = True
"""

FAKE_TORCH_CUDA = """
import os, sys
_queued_calls = []
_initialized = False
fractions = {}
at_queue_time = []

def is_initialized():
    return _initialized

def _lazy_call(fn, **kwargs):
    at_queue_time.append(getattr(sys.modules["torch"], "READY", False))
    if _initialized:
        fn()
    else:
        _queued_calls.append(fn)

def init():
    global _initialized
    _initialized = True
    for fn in _queued_calls:
        fn()

def device_count():
    return len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))

class _Props:
    total_memory = 24 * 2**30

def get_device_properties(i):
    return _Props()

def set_per_process_memory_fraction(fraction, device=None):
    assert isinstance(fraction, float)
    fractions[device] = fraction
"""

USE_FAKE_TORCH = textwrap.dedent("""
    import json, sys
    import torch
    out = {"queued": len(torch.cuda._queued_calls), "init": torch.cuda.is_initialized(),
           "after_import": torch.cuda.at_queue_time}
    torch.cuda.init()
    out["fractions"] = torch.cuda.fractions
    print(json.dumps(out))
""")


def held(out: dict[str, Any]) -> dict[str, int]:
    """What the fake torch's allocator may hold per device at the fractions set (24 GiB
    each), rounded as PyTorch rounds them."""
    return {d: allowed_bytes(f, 24 * GiB) for d, f in out["fractions"].items()}


@pytest.fixture
def fake_torch(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_TORCH_INIT)
    (pkg / "cuda.py").write_text(FAKE_TORCH_CUDA)
    return pkg.parent


def test_hook_caps_each_visible_device_at_cuda_init(gw: Run, fake_torch: Path) -> None:
    pp = f"{fake_torch}{os.pathsep}{SRC}"
    out = shown(
        gw(
            "exec",
            "--mem",
            "6G",
            "--count",
            "2",
            "--",
            sys.executable,
            "-c",
            USE_FAKE_TORCH,
            extra_env={"PYTHONPATH": pp},
        )
    )
    assert out["queued"] == 1 and out["init"] is False  # queued, CUDA untouched
    assert out["after_import"] == [True]  # registered after torch finished importing
    # The budget is what the allocator may hold: the CUDA context is outside it.
    assert held(out) == {"0": 6 * GiB, "1": 6 * GiB}
    out = shown(
        gw(
            "exec",
            "--mem",
            "6G",
            "--",
            sys.executable,
            "-c",
            USE_FAKE_TORCH,
            extra_env={"PYTHONPATH": pp, "GPUWARDEN_CONTEXT_BYTES": str(1 << 30)},
        )
    )
    assert held(out) == {"0": 6 * GiB}  # whatever the context allowance


def test_hook_does_nothing_without_a_cap_or_without_torch(gw: Run, fake_torch: Path) -> None:
    pp = f"{fake_torch}{os.pathsep}{SRC}"
    out = shown(
        gw(
            "exec",
            "--mem",
            "6G",
            "--no-cap",
            "--",
            sys.executable,
            "-c",
            USE_FAKE_TORCH,
            extra_env={"PYTHONPATH": pp},
        )
    )
    assert out["queued"] == 0 and out["fractions"] == {}
    r = gw(
        "exec",
        "--mem",
        "6G",
        "--",
        sys.executable,
        "-c",
        "import sys, json; print('torch' in sys.modules, 'sitecustomize' in sys.modules)",
    )
    assert r.stdout.strip() == "False True" and r.stderr == ""


def test_hook_chains_an_existing_sitecustomize(gw: Run, fake_torch: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    pp = os.pathsep.join([str(other), str(fake_torch), str(SRC)])
    code = (
        "import os, json, torch; torch.cuda.init(); "
        "print(json.dumps([os.environ.get('CHAINED'), torch.cuda.fractions]))"
    )
    r = gw("exec", "--mem", "12G", "--", sys.executable, "-c", code, extra_env={"PYTHONPATH": pp})
    assert r.returncode == 0, r.stderr
    chained, fractions = json.loads(r.stdout)
    assert chained == "yes" and held({"fractions": fractions}) == {"0": 12 * GiB}
    # A broken one is reported as site.py would, and the program still runs.
    (other / "sitecustomize.py").write_text("raise RuntimeError('boom')\n")
    r = gw(
        "exec",
        "--mem",
        "12G",
        "--",
        sys.executable,
        "-c",
        "print('ran')",
        extra_env={"PYTHONPATH": pp},
    )
    assert r.stdout == "ran\n" and "Error in sitecustomize" in r.stderr and "boom" in r.stderr


def test_hook_applies_in_python_children(gw: Run, fake_torch: Path) -> None:
    # A launcher's Python workers inherit the cap (PYTHONPATH and the limit are env).
    pp = f"{fake_torch}{os.pathsep}{SRC}"
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {USE_FAKE_TORCH!r}])"
    out = shown(
        gw("exec", "--mem", "6G", "--", sys.executable, "-c", child, extra_env={"PYTHONPATH": pp})
    )
    assert held(out) == {"0": 6 * GiB}
