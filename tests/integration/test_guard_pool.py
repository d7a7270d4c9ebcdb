"""GpuPool with real spawned worker processes on the simulated GPUs: each worker pinned
to its GPU, capped and bound to the GPU's CPUs; results and exceptions like any
executor; a worker killed mid-task fails that task and is replaced; a failing
initializer breaks the pool with its error instead of hanging."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.errors import UsageError
from gpuwarden.guard import BrokenPool, GpuPool, WorkerDied
from gpuwarden.guard.pool import RemoteTraceback
from gpuwarden.launch import HOOK_DIR
from gpuwarden.units import GiB
from tests.helpers.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The idle 2-GPU scenario: GPU 0's local CPU is 0, GPU 1's is 1."""
    monkeypatch.setenv("GPUWARDEN_SIM", str(ROOT / "examples" / "idle-2gpu.json"))
    monkeypatch.setenv("GPUWARDEN_SIM_STATE", str(tmp_path / "sim"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("GPUWARDEN_BUDGET", raising=False)
    yield


# Tasks: module-level so the spawned workers can import them.
def where() -> dict[str, Any]:
    return {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "order": os.environ.get("CUDA_DEVICE_ORDER"),
        "limit": os.environ.get("GPUWARDEN_MEM_LIMIT"),
        "hook": os.environ.get("PYTHONPATH", "").split(os.pathsep)[0],
        "cpus": sorted(os.sched_getaffinity(0)),
        "pid": os.getpid(),
    }


def square(x: int) -> int:
    return x * x


def fail(message: str) -> None:
    raise ValueError(message)


def nap(seconds: float, marker: str | None = None) -> int:
    if marker:
        Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


def exit_now(code: int) -> None:
    os._exit(code)


def unpicklable_result() -> Any:
    return lambda: None


def broken_init() -> None:
    raise RuntimeError("no such model file: /models/x.bin")


def wait_file(path: Path, timeout: float = 30) -> str:
    return str(
        wait_for(
            lambda: path.exists() and path.read_text(),
            timeout,
            0.02,
            what=lambda _: f"{path} never appeared",
        )
    )


def test_each_worker_is_pinned_to_its_gpu_capped_and_on_the_gpus_cpus() -> None:
    with GpuPool(gpus=[0, 1], memory="0.25") as pool:
        seen = [pool.submit_to(d, where).result(timeout=60) for d in (0, 1)]
        infos = pool.workers()
    for device, got in enumerate(seen):
        assert got["visible"] == str(device) and got["order"] == "PCI_BUS_ID"
        assert got["limit"] == str(6 * GiB)  # a quarter of 24 GiB
        assert got["hook"] == str(HOOK_DIR)  # the PyTorch cap loads when torch does
        if len(os.sched_getaffinity(0)) > 1:
            assert got["cpus"] == [device]
    assert [(i.device, i.gpu_index, i.memory_limit) for i in infos] == [
        (0, 0, 6 * GiB),
        (1, 1, 6 * GiB),
    ]
    assert {i.pid for i in infos} == {s["pid"] for s in seen}


def test_without_a_memory_share_workers_are_uncapped() -> None:
    with GpuPool(gpus=[1]) as pool:
        got = pool.submit(where).result(timeout=60)
    assert got["visible"] == "1" and got["limit"] is None and got["hook"] != str(HOOK_DIR)


def test_under_the_daemon_workers_split_the_job_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_BUDGET", str(8 * GiB))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the job's one GPU is the machine's 1
    with GpuPool(workers_per_gpu=2) as pool:
        infos = pool.workers()
        got = [pool.submit(where).result(timeout=60) for _ in range(2)]
    assert [(i.device, i.gpu_index, i.memory_limit) for i in infos] == [(0, 1, 4 * GiB)] * 2
    assert {g["visible"] for g in got} == {"1"} and {g["limit"] for g in got} == {str(4 * GiB)}


def test_results_come_back_in_order_and_exceptions_with_the_workers_traceback() -> None:
    with GpuPool(gpus=[0, 1], workers_per_gpu=2) as pool:
        assert list(pool.map(square, range(40))) == [x * x for x in range(40)]
        with pytest.raises(ValueError, match="bad shard 7") as err:
            pool.submit(fail, "bad shard 7").result(timeout=60)
        assert isinstance(err.value.__cause__, RemoteTraceback)
        assert "in fail" in str(err.value.__cause__)
        with pytest.raises(RuntimeError, match="result could not be sent back"):
            pool.submit(unpicklable_result).result(timeout=60)
        with pytest.raises(Exception, match="pickle"):
            pool.submit(lambda: 1).result(timeout=60)
        assert pool.submit(square, 9).result(timeout=60) == 81  # still serving


def test_a_worker_killed_mid_task_fails_that_task_and_is_replaced(tmp_path: Path) -> None:
    with GpuPool(gpus=[0]) as pool:
        marker = tmp_path / "running"
        doomed = pool.submit(nap, 60, str(marker))
        pid = int(wait_file(marker))
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(
            WorkerDied,
            match=rf"worker 0 on GPU 0 \(pid {pid}\) killed by "
            r"SIGKILL while running nap",
        ):
            doomed.result(timeout=30)
        after = pool.submit(nap, 0).result(timeout=60)
        assert after != pid and [i.pid for i in pool.workers()] == [after]
        crashed = pool.submit(exit_now, 3)
        with pytest.raises(WorkerDied, match="exited with code 3 while running exit_now"):
            crashed.result(timeout=30)
        assert pool.submit(square, 3).result(timeout=60) == 9


def test_a_failing_initializer_breaks_the_pool_with_its_error() -> None:
    pool = GpuPool(gpus=[0], initializer=broken_init)
    try:
        future = pool.submit(square, 2)
        with pytest.raises(BrokenPool, match="no such model file"):
            future.result(timeout=60)
        with pytest.raises(BrokenPool):
            pool.submit(square, 2)
    finally:
        pool.shutdown()


def test_shutdown_can_cancel_what_has_not_started(tmp_path: Path) -> None:
    pool = GpuPool(gpus=[0])
    marker = tmp_path / "running"
    first = pool.submit(nap, 0.5, str(marker))
    rest = [pool.submit(square, i) for i in range(5)]
    wait_file(marker)
    pool.shutdown(wait=True, cancel_futures=True)
    assert isinstance(first.result(timeout=1), int)
    for f in rest:
        with pytest.raises(CancelledError):
            f.result(timeout=1)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(square, 1)
    assert pool.workers() == []


def test_bad_input_is_refused_before_any_worker_starts() -> None:
    with pytest.raises(UsageError, match="workers_per_gpu"):
        GpuPool(workers_per_gpu=0)
    with pytest.raises(UsageError, match="no GPU cuda:5: this process sees 2"):
        GpuPool(gpus=[5])
    with pytest.raises(UsageError, match="more than GPU 0 has"):
        GpuPool(gpus=[0], memory="30G")
    with pytest.raises(UsageError, match="named twice"):
        GpuPool(gpus=[0, 0])
    with GpuPool(gpus=[0]) as pool, pytest.raises(UsageError, match="no worker on cuda:1"):
        pool.submit_to(1, square, 1)
