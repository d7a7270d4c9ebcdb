"""gpuwarden.guard on a real GPU: a real CUDA OOM is retried once the batch has halved;
budgets refuse an over-commit as NVML sees the GPU; the worker pool runs on the GPU with
its cap applied and survives a worker killed with SIGKILL; a model built here loads
under a budget at a reduced precision and stays within it as NVML measures it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.errors import UsageError
from gpuwarden.guard import BudgetExceeded, GpuPool, MemoryBudgets, WorkerDied, oom_retry
from gpuwarden.units import GiB, MiB

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]
ROOT = Path(__file__).resolve().parents[2]


def test_a_real_oom_is_retried_with_half_the_batch() -> None:
    torch = pytest.importorskip("torch")
    free, _ = torch.cuda.mem_get_info(0)
    unit = free // 24  # bytes per batch item: 32 items never fit, 16 do
    seen: list[int] = []

    @oom_retry(4, backoff=0.01, batch_size=32, min_batch_size=1)
    def step(*, batch_size: int) -> int:
        seen.append(batch_size)
        x = torch.empty(batch_size * unit, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        return batch_size

    assert step() == 16
    assert seen == [32, 16] and step.retry.ooms == 1  # type: ignore[attr-defined]
    print("batch sizes tried:", seen, "unit", unit)


def test_budgets_refuse_an_overcommit_on_the_real_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUWARDEN_BUDGET", raising=False)
    budgets = MemoryBudgets()
    usage = budgets.usage(0)
    print(usage)
    assert usage.reading.total > 10 * GiB and not usage.under_daemon
    assert usage.limit <= usage.reading.total
    budgets.register("a", 0.6)
    with pytest.raises(BudgetExceeded, match="does not fit on cuda:0"):
        budgets.register("b", 0.6)
    budgets.release("a")
    monkeypatch.setenv("GPUWARDEN_BUDGET", str(8 * GiB))
    job = MemoryBudgets()
    job.register("encoder", "4G")
    job.register("decoder", "4G")  # the job budget is the allocator's: the context is outside
    with pytest.raises(BudgetExceeded, match="job budget"):
        job.register("more", "1M")


# Pool tasks: module-level so the spawned workers import them from here.
def allocate(gib: float, hold: float = 0.0) -> dict[str, Any]:
    import torch

    x = torch.empty(int(gib * GiB), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    if hold:
        Path(os.environ["GW_TEST_MARKER"]).write_text(str(os.getpid()))
        time.sleep(hold)
    out = {
        "pid": os.getpid(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "reserved": int(torch.cuda.memory_reserved(0)),
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    del x
    return out


def nvml_pids() -> dict[int, int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {
            p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        }
    finally:
        pynvml.nvmlShutdown()


def test_the_pool_runs_capped_workers_and_survives_a_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "holding"
    monkeypatch.setenv("GW_TEST_MARKER", str(marker))
    monkeypatch.delenv("GPUWARDEN_BUDGET", raising=False)
    with GpuPool(gpus=[0], workers_per_gpu=2, memory="4G") as pool:
        ok = list(pool.map(allocate, [2.0, 2.5]))
        assert all(o["visible"] == "0" and o["reserved"] >= 2 * GiB for o in ok)
        # the cap: 4 GiB for the worker's allocations (its CUDA context is outside it)
        with pytest.raises(Exception, match="out of memory") as err:
            pool.submit(allocate, 4.5).result(timeout=120)
        assert type(err.value).__name__ == "OutOfMemoryError"
        holding = pool.submit(allocate, 2.0, 600)
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        victim = int(marker.read_text())
        used = nvml_pids()
        assert used.get(victim, 0) >= 2 * GiB, used
        assert all(
            v <= 4 * GiB + 2 * GiB
            for p, v in used.items()  # + its context
            if p in {w.pid for w in pool.workers()}
        ), used
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(WorkerDied, match="killed by SIGKILL"):
            holding.result(timeout=60)
        again = pool.submit(allocate, 2.0).result(timeout=120)
        assert again["pid"] != victim
        deadline = time.monotonic() + 30
        while victim in nvml_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert victim not in nvml_pids()  # the killed worker's memory came back
        print("workers", pool.workers(), "nvml", {p: v // MiB for p, v in nvml_pids().items()})


LOAD_CHILD = """
import json, os, sys, torch, pynvml
from gpuwarden.guard import load_within_budget, DoesNotFit, MissingDependency
budget, batch, quantizer = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
def build():
    return torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(4)])
def example(m):
    dtype = torch.float32 if next(m.parameters()).dtype == torch.float32 else torch.bfloat16
    m(torch.randn(batch, 8192, device="cuda", dtype=dtype))
try:
    got = load_within_budget(build, budget=budget, example=example if batch else None,
                             quantizer=quantizer)
except (DoesNotFit, MissingDependency) as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)})); sys.exit(0)
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        if p.pid == os.getpid()]
print(json.dumps({"precision": got.precision, "backend": got.backend, "peak": got.peak,
                  "nvml": mine[0] if mine else None, "plans": [p.describe() for p in got.plans],
                  "text": str(got)}))
"""


def load_in_child(budget: str, batch: int = 0, quantizer: str = "") -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    env.pop("GPUWARDEN_BUDGET", None)
    out = subprocess.run(
        [sys.executable, "-c", LOAD_CHILD, budget, str(batch), quantizer],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    print(budget, batch, quantizer, result)
    return result


def test_a_model_loads_at_the_precision_that_fits_and_stays_within_budget() -> None:
    """Four 8192x8192 linears: 1 GiB in fp32, 512 MiB in bf16, 256 MiB in 8 bits."""
    roomy = load_in_child("3G")
    assert roomy["precision"] == "fp32" and roomy["nvml"] <= 3 * GiB
    tight = load_in_child("1.4G")
    assert tight["precision"] == "bf16" and tight["nvml"] <= 1.4 * GiB
    assert tight["peak"] <= 1.4 * GiB
    # a measured activation: 16384 rows make fp32 overrun 2.5 GiB; bf16 fits
    measured = load_in_child("2.5G", batch=16384)
    assert measured["precision"] == "bf16" and measured["nvml"] <= 2.5 * GiB, measured
    assert load_in_child("2.5G")["precision"] == "fp32"  # without it, fp32 was the guess
    installed = [q for q in ("torchao", "bitsandbytes") if importlib.util.find_spec(q)]
    for quantizer in installed:
        eight = load_in_child("1.0G", quantizer=quantizer)
        assert eight.get("precision") == "int8" and eight["backend"] == quantizer, eight
        assert eight["nvml"] <= 1.0 * GiB, eight
    if not installed:
        assert load_in_child("1.0G") == {
            "error": "MissingDependency",
            "message": "8-bit weights need torchao or bitsandbytes: pip install torchao",
        }
    nothing = load_in_child("600M")
    assert nothing["error"] == "DoesNotFit", nothing
    assert nothing["message"].startswith("nothing fits 600MiB: this process holds")


def test_a_bad_budget_is_a_usage_error() -> None:
    from gpuwarden.guard import load_within_budget

    with pytest.raises(UsageError, match="invalid size"):
        load_within_budget(lambda: None, budget="lots")
