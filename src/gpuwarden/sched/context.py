"""The CUDA context allowance: what a process's context takes on a GPU beside what its
allocator holds. A job's budget (``--mem``) is what its allocations may hold; placement
books the budget plus this allowance on each of its GPUs, the watchdog and an MPS
client's memory limit allow for it, and ``show`` prints both figures.

The allowance is measured, not guessed: when a single-GPU job ends, the driver's peak
figure for it less the allocator's own peak (reported by the cap hook) is one sample
for that GPU model and driver. The allowance is the median of the latest samples
(robust to one odd job, or to a job that writes a false report), else ``context_memory``
from the config, else ``DEFAULT_CONTEXT``.

Contexts differ between jobs on one model by the kernels each loads (on an H200, 518 MiB
right after CUDA starts, 676 MiB once cuBLAS has run), so about half of the jobs have
more than the median beside a budget they fill exactly. The watchdog therefore judges a
job against ``ceiling``: the upper quartile of the same samples, at most ``MAX_SPREAD``
above the median. Pure: the daemon keeps the samples."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from gpuwarden.units import MiB

DEFAULT_CONTEXT = 704 * MiB
"""A CUDA context with PyTorch's kernels loaded, rounded up: 518 MiB on an H200 right
after CUDA starts, 676 MiB once a torch 2.11 job has run its matmuls there (cuBLAS's
kernels load lazily); less on older GPUs. Used until a GPU model has samples."""
SAMPLE_RANGE = (64 * MiB, 8192 * MiB)
"""Samples outside this range are not contexts (a report that lies, a peak the daemon's
sampling missed): they are dropped."""
SAMPLES_KEPT = 15
MAX_SPREAD = 256 * MiB
"""How far past the allowance ``ceiling`` may go, whatever the samples say: jobs that
report false peaks could otherwise widen every neighbour's tolerance."""


def sample(driver_peak: int | None, allocator_peak: int | None) -> int | None:
    """One measurement of the context from a job's driver peak and its allocator peak
    on the same GPU; None when either is unknown or the difference is implausible."""
    if driver_peak is None or allocator_peak is None or allocator_peak < 0:
        return None
    value = driver_peak - allocator_peak
    lo, hi = SAMPLE_RANGE
    return value if lo <= value <= hi else None


def allowance(samples: Sequence[int], configured: int | None = None) -> int:
    """The allowance for one GPU model and driver: ``configured`` when the admin set
    one, else the median of the samples rounded up to a MiB, else the default."""
    if configured is not None:
        return configured
    if not samples:
        return DEFAULT_CONTEXT
    return _mib_up(int(statistics.median(samples[-SAMPLES_KEPT:])))


def _mib_up(n: int) -> int:
    return -(-n // MiB) * MiB


def ceiling(samples: Sequence[int], configured: int | None = None) -> int:
    """The largest context the watchdog takes for one beside a job's capped allocations
    on this GPU model: ``configured`` when the admin set one (it is the whole rule
    then), else the upper quartile of the latest samples, rounded up to a MiB and at
    most ``MAX_SPREAD`` above the allowance; the default before any sample."""
    if configured is not None:
        return configured
    if not samples:
        return DEFAULT_CONTEXT
    latest = sorted(samples[-SAMPLES_KEPT:])
    rank = -(-3 * len(latest) // 4)  # the nearest rank of the upper quartile: ceil(3n/4)
    upper = latest[rank - 1]
    base = allowance(samples)
    return max(base, min(_mib_up(upper), base + MAX_SPREAD))
