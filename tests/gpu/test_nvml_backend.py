"""The NVML backend against a real GPU (H200 on the device machine) and torch.

Run with ``pytest -m gpu tests/gpu``. torch work happens in child processes so that
the test process itself never holds a CUDA context that would show up in NVML."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from gpuwarden.gpus.nvml import NvmlBackend
from gpuwarden.procs.namespace import in_child_pid_namespace
from tests.helpers.procs import end_process

GiB = 1 << 30


@pytest.fixture
def backend() -> Iterator[NvmlBackend]:
    b = NvmlBackend.open()
    try:
        yield b
    finally:
        b.close()


def _bare(uuid: str) -> str:
    return uuid.removeprefix("GPU-").lower()


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(extra)
    return env


@pytest.mark.gpu
def test_gpus_report_their_memory_and_uuid(backend: NvmlBackend) -> None:
    pytest.importorskip("torch")
    gpus = backend.gpus()
    assert gpus, backend.warnings
    g0 = gpus[0]
    assert g0.index == 0
    # nvidia-smi's total is NVML's, in MiB (an H200 has about 141 GB, an H100 80 GB).
    smi = subprocess.run(
        ["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert g0.memory_total // (1 << 20) == int(smi.stdout.strip()), smi.stdout
    assert g0.memory_total > 8 * GiB
    assert g0.memory_used + g0.memory_free + (g0.memory_reserved or 0) == g0.memory_total
    assert g0.uuid.startswith("GPU-")
    assert g0.compute_mode in ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process")
    assert g0.pci_bus_id
    # torch in PCI order numbers GPUs as NVML does; ask it in a child for every uuid.
    code = (
        "import torch\n"
        "for i in range(torch.cuda.device_count()):\n"
        "    print(torch.cuda.get_device_properties(i).uuid)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_child_env(CUDA_DEVICE_ORDER="PCI_BUS_ID"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    torch_uuids = [_bare(line) for line in out.stdout.split()]
    assert torch_uuids, out.stderr
    assert _bare(g0.uuid) == torch_uuids[0]
    assert [_bare(g.uuid) for g in gpus] == torch_uuids


@pytest.mark.gpu
def test_a_torch_process_appears_with_its_memory(backend: NvmlBackend) -> None:
    pytest.importorskip("torch")
    gpus = backend.gpus()
    assert gpus, backend.warnings
    code = (
        "import time, torch\n"
        "x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
        "torch.cuda.synchronize()\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    # Pin the child to NVML's GPU 0 by uuid, whatever order CUDA would pick. stderr
    # goes to a file so torch's warnings can neither block the child nor hide "ready".
    with (
        tempfile.TemporaryFile(mode="w+") as errors,
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=_child_env(CUDA_VISIBLE_DEVICES=gpus[0].uuid),
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        ) as child,
    ):
        try:
            assert child.stdout is not None
            ready, _, _ = select.select([child.stdout], [], [], 120)
            line = child.stdout.readline() if ready else ""
            if line.strip() != "ready":
                errors.seek(0)
                pytest.fail(f"torch child not ready: {line!r} {errors.read()[-2000:]}")

            deadline = time.monotonic() + 10
            seen = []
            while time.monotonic() < deadline:
                seen = [p for p in backend.processes() if p.gpu_index == 0]
                if in_child_pid_namespace():
                    # NVML reports host pids, which this namespace cannot see: settle for
                    # a 1 GiB process on GPU 0.
                    found = [p for p in seen if p.memory is not None and p.memory >= GiB]
                else:
                    found = [p for p in seen if p.pid == child.pid]
                if found and found[0].memory is not None and found[0].memory >= GiB:
                    assert "compute" in found[0].kinds
                    break
                time.sleep(0.2)
            else:
                pytest.fail(f"pid {child.pid} with >= 1 GiB not on GPU 0 within 10 s: {seen}")
        finally:
            end_process(child)


@pytest.mark.gpu
def test_device_files_use_the_minor_number(backend: NvmlBackend) -> None:
    gpus = backend.gpus()
    assert gpus, backend.warnings
    files = backend.device_files()
    minor = gpus[0].minor_number
    assert minor is not None
    assert files[f"/dev/nvidia{minor}"] == 0
    assert files["/dev/nvidiactl"] is None
    assert os.path.exists(f"/dev/nvidia{minor}")


@pytest.mark.gpu
def test_driver_version_and_idempotent_close() -> None:
    b = NvmlBackend.open()
    version = b.driver_version()
    assert version and version[0].isdigit()
    b.close()
    b.close()


@pytest.mark.gpu
def test_local_cpus_are_what_nvml_affinity_says(backend: NvmlBackend) -> None:
    """The backend reads a GPU's local CPUs from sysfs (a file read, where NVML's
    affinity call takes milliseconds): the same CPUs NVML names."""
    import pynvml

    from gpuwarden.gpus.nvml_values import cpu_mask_to_cpulist
    from gpuwarden.gpus.topology import parse_cpulist

    for g in backend.gpus():
        h = pynvml.nvmlDeviceGetHandleByIndex(g.index)
        words = max(1, ((os.cpu_count() or 1) + 63) // 64) + 1
        mask = pynvml.nvmlDeviceGetCpuAffinity(h, words)
        nvml = cpu_mask_to_cpulist([int(w) for w in mask], 64)
        print(f"GPU {g.index}: backend {g.cpus}, NVML {nvml}")
        assert g.cpus and parse_cpulist(g.cpus) == parse_cpulist(nvml)
