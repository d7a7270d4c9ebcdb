"""OOM self-healing decisions: was a failure a CUDA out-of-memory, what budget a retry
gets, and how long it backs off. Pure: the daemon reads the log tail and the peak, and
carries out what these return."""

from __future__ import annotations

import re
from dataclasses import dataclass

# What CUDA, PyTorch, cuBLAS/cuDNN and MPS print when memory runs out (the simulated
# job prints PyTorch's words too). Matched against the end of the job's output.
SIGNATURES = (
    ("CUDA out of memory", re.compile(r"CUDA out of memory|CUDA error: out of memory", re.I)),
    ("torch.OutOfMemoryError", re.compile(r"\b(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b")),
    ("cudaErrorMemoryAllocation", re.compile(r"cudaErrorMemoryAllocation")),
    ("CUBLAS_STATUS_ALLOC_FAILED", re.compile(r"CUBLAS_STATUS_ALLOC_FAILED")),
    ("CUDNN_STATUS_ALLOC_FAILED",
     re.compile(r"CUDNN_STATUS_(?:ALLOC_FAILED|NOT_ENOUGH_WORKSPACE)")),
    ("CUDA_ERROR_OUT_OF_MEMORY", re.compile(r"CUDA_ERROR_OUT_OF_MEMORY|out of memory \(2\)")),
    ("MPS memory limit", re.compile(r"MPS.*(?:memory limit|pinned device memory)", re.I)),
)
GROWTH = 1.25
FAILS_BEFORE_HOLD = 3


def oom_signature(output_tail: str) -> str | None:
    """The last line of the job's output that says it ran out of GPU memory (trimmed),
    or None when none does."""
    for line in reversed(output_tail.splitlines()):
        for _, pattern in SIGNATURES:
            if pattern.search(line):
                line = line.strip()
                return line if len(line) <= 300 else line[:297] + "..."
    return None


@dataclass(frozen=True)
class Retry:
    """Decision: queue the job again with ``budget`` bytes per GPU after ``delay`` s."""

    budget: int
    delay: float


@dataclass(frozen=True)
class GiveUp:
    """Decision: the OOM failure stands; ``reason`` says why no retry."""

    reason: str


def after_oom(*, old_budget: int | None, peak: int | None, largest: int, used: int,
              allowed: int, backoff: float) -> Retry | GiveUp:
    """An OOM failure with ``used`` of ``allowed`` retries spent. The retry budget is
    max(1.25 × peak, 1.25 × old budget), capped by the largest GPU's capacity; a job
    that had a whole GPU, or is at the cap already, cannot get more."""
    if used >= allowed:
        return GiveUp(f"out of retries ({used} of {allowed} used)" if allowed
                      else "no retries asked for (--retries)")
    if old_budget is None:
        return GiveUp("it had a whole GPU: there is no bigger budget to retry with")
    want = max(int(GROWTH * (peak or 0)), int(GROWTH * old_budget))
    budget = min(want, largest)
    if budget <= old_budget:
        return GiveUp("its budget is already the largest a GPU here can give")
    return Retry(budget=budget, delay=backoff * (2 ** used))
