"""The arithmetic of gpuwarden's PyTorch cap, in one place for the ``sitecustomize``
hook beside it (which loads this file by its path, since the hook imports nothing from
gpuwarden), the Ray workers and the simulated torch (``sim/job.py``), so that the cap
they model is the cap that is set.

PyTorch's caching allocator turns a memory fraction into its maximum as
``static_cast<size_t>(fraction * total)`` (``setMemoryFraction``). ``limit / total``
alone can land one byte short of ``limit``: on an H100 whose CUDA total is 85,017,493,504
bytes, 25 GiB and 50 GiB among others do, and a job that fills its budget exactly then
fails with an OOM at its cap. Half a byte more lands on ``limit`` itself. Old syntax, as
the hook: it runs under any Python the job brings."""

from __future__ import annotations


def memory_fraction(limit: int, total: int) -> float:
    """The fraction of ``total`` bytes at which the allocator may hold exactly ``limit``
    bytes (1.0 when the limit is the whole device or more)."""
    if limit >= total:
        return 1.0
    return (float(limit) + 0.5) / float(total)


def allowed_bytes(fraction: float, total: int) -> int:
    """What PyTorch's allocator may hold at ``fraction`` of ``total`` bytes."""
    return int(fraction * float(total))
