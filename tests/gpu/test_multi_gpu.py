"""Several real GPUs: NUMA facts match sysfs, CUDA_VISIBLE_DEVICES from exec lands on the
intended physical GPU inside torch, and a two-GPU torchrun all-reduce placed by exec works
with the machine's NCCL settings kept. Skipped on a one-GPU machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwarden.gpus.nvml import NvmlBackend
from gpuwarden.gpus.topology import parse_cpulist, sysfs_local_cpulist
from tests.helpers.procs import end_process

GiB = 1 << 30
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _gpus() -> list:  # type: ignore[type-arg]
    b = NvmlBackend.open()
    try:
        return b.gpus()
    finally:
        b.close()


def _env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "GPUWARDEN_SIM")
    }
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _need_two() -> list:  # type: ignore[type-arg]
    pytest.importorskip("torch")
    gpus = _gpus()
    if len(gpus) < 2:
        pytest.skip("needs at least two GPUs")
    return gpus


@pytest.mark.gpu
def test_every_gpu_has_its_numa_node_and_local_cpus() -> None:
    for g in _gpus():
        print(
            f"GPU {g.index} {g.uuid} bus {g.pci_bus_id} numa {g.numa_node} cpus {g.cpus} "
            f"peers {g.nvlink_peers}"
        )
        assert g.cpus, f"GPU {g.index}: no local CPUs known"
        sysfs = sysfs_local_cpulist(g.pci_bus_id)
        if sysfs:
            assert parse_cpulist(g.cpus) == parse_cpulist(sysfs)


@pytest.mark.gpu
def test_exec_lands_on_the_intended_physical_gpu() -> None:
    gpus = _need_two()
    g0, g1 = gpus[0], gpus[1]
    # Fill most of GPU 0, so a request for more than what is left there must go to GPU 1.
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import torch,time; x=torch.empty({int(g0.memory_total * 0.7)},"
            " dtype=torch.uint8, device='cuda'); print('ready', flush=True); time.sleep(120)",
        ],
        env={**_env(), "CUDA_VISIBLE_DEVICES": g0.uuid},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert hog.stdout is not None and hog.stdout.readline().strip() == "ready"
        probe = (
            "import os, torch; print(os.environ['CUDA_VISIBLE_DEVICES']); "
            "print(torch.cuda.device_count()); "
            "print(torch.cuda.get_device_properties(0).uuid); "
            "print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"
        )
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuwarden",
                "exec",
                "--mem",
                str(int(g1.memory_total * 0.5)),
                "-v",
                "--",
                sys.executable,
                "-c",
                probe,
            ],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        visible, count, uuid, cpus = r.stdout.strip().splitlines()
        print(r.stderr, r.stdout)
        assert visible == str(g1.index) and count == "1"
        assert uuid.removeprefix("GPU-") == g1.uuid.removeprefix("GPU-")
        assert {int(c) for c in cpus.split(",")} <= parse_cpulist(g1.cpus or "")
    finally:
        end_process(hog)


ALLREDUCE = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    t = torch.ones(4, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    print(f"rank={rank} sum={t[0].item()} visible={os.environ['CUDA_VISIBLE_DEVICES']} "
          f"uuid={torch.cuda.get_device_properties(torch.cuda.current_device()).uuid} "
          f"nvls={os.environ.get('NCCL_NVLS_ENABLE')} cpus={len(os.sched_getaffinity(0))}",
          flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.gpu
def test_two_gpu_torchrun_allreduce_placed_by_exec(tmp_path: Path) -> None:
    gpus = _need_two()
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "exec",
            "--count",
            "2",
            "--mem",
            "2G",
            "-v",
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(script),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(r.stdout, r.stderr[-3000:])
    assert r.returncode == 0
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("rank=")]
    assert len(lines) == 2
    assert all("sum=3.0" in ln for ln in lines)
    uuids = {ln.split("uuid=")[1].split()[0].removeprefix("GPU-") for ln in lines}
    assert len(uuids) == 2 and uuids <= {g.uuid.removeprefix("GPU-") for g in gpus}
    if "NCCL_NVLS_ENABLE" in os.environ:  # the machine's NCCL settings must survive exec
        assert all(f"nvls={os.environ['NCCL_NVLS_ENABLE']}" in ln for ln in lines)


@pytest.mark.gpu
def test_daemon_places_a_two_gpu_torchrun_job_on_two_gpus(tmp_path: Path) -> None:
    """A 2-GPU job placed by the daemon gets two distinct GPUs (NVLink peers where there
    are), CPUs local to them, and the machine's NCCL settings; a 1-GPU job beside it keeps
    running."""
    import json
    import shutil
    import tempfile
    import time

    gpus = _need_two()
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    script.chmod(0o644)
    tmp_path.chmod(0o755)
    short = Path(tempfile.mkdtemp(prefix="gw-"))
    env = {**_env(), "GPUWARDEN_HOME": str(short / "home")}
    (short / "home").mkdir()
    (short / "home" / "config.toml").write_text('interval = "200ms"\n')

    def cli(*args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    try:
        cli("daemon", "start")
        beside = int(
            cli(
                "submit",
                "--mem",
                "4G",
                "--",
                sys.executable,
                "-c",
                "import torch, time; x = torch.ones(1 << 28, device='cuda'); "
                "time.sleep(40); print('beside done')",
            )
        )
        deadline = time.monotonic() + 60
        while json.loads(cli("show", str(beside), "--json"))["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.3)
        two = int(
            cli(
                "submit",
                "--gpus",
                "2",
                "--mem",
                "8G",
                "--",
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                str(script),
            )
        )
        subprocess.run([sys.executable, "-m", "gpuwarden", "wait", str(two)], env=env, timeout=300)
        job = json.loads(cli("show", str(two), "--json"))
        out = cli("logs", str(two))
        print(
            job["state"],
            job["gpus"],
            job["peak_memory"],
            out,
            cli("logs", "--stderr", str(two))[-2000:],
        )
        assert job["state"] == "succeeded"
        assert len(set(job["gpus"])) == 2
        # Both ranks write to the job's one stdout; their lines can interleave.
        lines = re.findall(r"rank=\d+ sum=\S+ visible=\S+ uuid=\S+ nvls=\S+ cpus=\d+", out)
        assert len(lines) == 2 and all("sum=3.0" in ln for ln in lines)
        uuids = {ln.split("uuid=")[1].split()[0] for ln in lines}
        by_index = {g.index: g.uuid.removeprefix("GPU-") for g in gpus}
        assert uuids == {by_index[i] for i in job["gpus"]}
        if "NCCL_NVLS_ENABLE" in os.environ:
            assert all(f"nvls={os.environ['NCCL_NVLS_ENABLE']}" in ln for ln in lines)
        assert json.loads(cli("show", str(beside), "--json"))["state"] in ("running", "succeeded")
    finally:
        subprocess.run([sys.executable, "-m", "gpuwarden", "daemon", "stop"], env=env, timeout=60)
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.gpu
def test_packing_and_preemption_across_gpus() -> None:
    """As in the simulated tests, on real GPUs: jobs of 40% of a GPU pack two per GPU;
    a besteffort job on two GPUs is preempted by a guaranteed one that needs one of them,
    is queued again and finishes after it."""
    import json
    import shutil
    import tempfile
    import time

    import torch

    gpus = _need_two()
    total = torch.cuda.get_device_properties(0).total_memory
    hold = (
        "import sys, time, torch; n = int(sys.argv[1]); "
        "x = torch.empty(n, dtype=torch.uint8, device='cuda'); x.fill_(1); "
        "torch.cuda.synchronize(); print('holding', flush=True); "
        "time.sleep(float(sys.argv[2]))"
    )
    root = Path(tempfile.mkdtemp(prefix="gw-"))
    home = root / "home"
    home.mkdir()
    (home / "config.toml").write_text('interval = "200ms"\ngrace = "3s"\n')
    env = _env()
    env["GPUWARDEN_HOME"] = str(home)

    def gw(*args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert r.returncode == 0 or args[0] == "wait", (args, r.stderr)
        return r.stdout

    def job(jid: int) -> dict:  # type: ignore[type-arg]
        return json.loads(gw("show", str(jid), "--json"))  # type: ignore[no-any-return]

    def wait_running(ids: list[int], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not all(job(j)["state"] == "running" for j in ids):
            assert time.monotonic() < deadline, [job(j)["state"] for j in ids]
            time.sleep(0.3)

    try:
        gw("daemon", "start")
        tenth = total // 10
        packed = [
            int(
                gw(
                    "submit",
                    "--mem",
                    f"{4 * tenth}B",
                    "--",
                    sys.executable,
                    "-c",
                    hold,
                    str(3 * tenth),
                    "8",
                )
            )
            for _ in range(4)
        ]
        wait_running(packed)
        placed = sorted(job(j)["gpus"][0] for j in packed)
        print("packed onto GPUs", placed)
        assert placed == [gpus[0].index, gpus[0].index, gpus[1].index, gpus[1].index]
        for j in packed:
            gw("wait", str(j))
        victim = int(
            gw(
                "submit",
                "--qos",
                "besteffort",
                "--gpus",
                "2",
                "--mem",
                str(6 * tenth),
                "--",
                sys.executable,
                "-c",
                hold,
                str(5 * tenth),
                "20",
            )
        )
        wait_running([victim])
        boss = int(
            gw(
                "submit",
                "--qos",
                "guaranteed",
                "--mem",
                f"{6 * tenth}B",
                "--",
                sys.executable,
                "-c",
                hold,
                str(5 * tenth),
                "3",
            )
        )
        gw("wait", str(boss))
        gw("wait", str(victim))
        v, b = job(victim), job(boss)
        for e in v["events"]:
            print("victim", e["at"], e["kind"], e["detail"])
        assert b["state"] == "succeeded" and v["state"] == "succeeded"
        assert v["preemptions"] == 1 and len(v["gpus"]) == 2
        kinds = [e["kind"] for e in v["events"]]
        assert kinds.index("preempted") < kinds.index("requeued")
    finally:
        subprocess.run(
            [sys.executable, "-m", "gpuwarden", "daemon", "stop"],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)
