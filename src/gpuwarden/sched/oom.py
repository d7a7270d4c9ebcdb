"""OOM self-healing decisions: was a failure a CUDA out-of-memory, what the message says
the job needed, what budget a retry gets, and whether it backs off. Pure: the daemon reads
the log tail and the peak, and carries out what these return."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuwarden.units import format_bytes

# What CUDA, PyTorch, cuBLAS/cuDNN and MPS print when memory runs out (the simulated
# job prints PyTorch's words too). Matched against the end of the job's output.
SIGNATURES = (
    ("CUDA out of memory", re.compile(r"CUDA out of memory|CUDA error: out of memory", re.I)),
    ("torch.OutOfMemoryError", re.compile(r"\b(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b")),
    ("cudaErrorMemoryAllocation", re.compile(r"cudaErrorMemoryAllocation")),
    ("CUBLAS_STATUS_ALLOC_FAILED", re.compile(r"CUBLAS_STATUS_ALLOC_FAILED")),
    (
        "CUDNN_STATUS_ALLOC_FAILED",
        re.compile(r"CUDNN_STATUS_(?:ALLOC_FAILED|NOT_ENOUGH_WORKSPACE)"),
    ),
    ("CUDA_ERROR_OUT_OF_MEMORY", re.compile(r"CUDA_ERROR_OUT_OF_MEMORY|out of memory \(2\)")),
    ("MPS memory limit", re.compile(r"MPS.*(?:memory limit|pinned device memory)", re.I)),
)
GROWTH = 1.25  # a retry gets at least this times the old budget
MARGIN = 0.10  # over what the job was shown to need: the next step may ask a little more
FAILS_BEFORE_HOLD = 3
# A job whose failing allocation was this small beside what it held crept into its cap
# (memory rising in many steps, as training warms up): the message shows only that it
# needs more, not how much. Its retry asks CREEP_MIN × what it reached, and takes up to
# CREEP_CEILING × that where the GPU it lands on has room, booked in full.
CREEP_STEP = 0.125
CREEP_MIN = 2.0
CREEP_CEILING = 4.0
# How long such a retry waits for room for its ceiling while jobs on a GPU may end and
# free it, before it takes what there is (at least its budget).
CREEP_WAIT = 120.0

# PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) prints sizes with
# format_size: "N bytes" up to 1 KiB, then KiB, MiB, GiB with two decimals.
_SIZE = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB|TiB)"
_UNIT = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_TRIED = re.compile(r"Tried to allocate " + _SIZE)
# "Including non-PyTorch memory, this process has Y memory in use." (NVML's figure)
_IN_USE = re.compile(r"this process has " + _SIZE + r" memory in use", re.I)
# "Of the allocated memory A is allocated by PyTorch, [with P allocated in private pools
# (e.g., CUDA Graphs), ]and R is reserved by PyTorch but unallocated."
_SPLIT = re.compile(
    r"Of the allocated memory "
    + _SIZE
    + r" is allocated by PyTorch, .*?and "
    + _SIZE
    + r" is reserved by PyTorch but unallocated"
)
# Before torch 2.1: "(GPU 0; 7.93 GiB total capacity; 130.35 MiB already allocated; 47.06
# MiB free; 188.00 MiB reserved in total by PyTorch)".
_OLD = re.compile(_SIZE + r" already allocated;.*?" + _SIZE + r" reserved in total by PyTorch")
_ALLOWED = re.compile(_SIZE + r" allowed;")


def oom_signature(output_tail: str) -> str | None:
    """The last line of the job's output that says it ran out of GPU memory (trimmed),
    or None when none does."""
    for line in reversed(output_tail.splitlines()):
        for _, pattern in SIGNATURES:
            if pattern.search(line):
                line = line.strip()
                return line if len(line) <= 300 else line[:297] + "..."
    return None


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNIT[unit])


@dataclass(frozen=True)
class OomAsk:
    """What one PyTorch OOM message says: the allocation that failed and what the process
    held when it did (bytes; None where the message does not say)."""

    tried: int
    in_use: int | None = None  # the driver's figure for the process: its CUDA context too
    allocated: int | None = None  # by PyTorch's allocator
    cached: int | None = None  # reserved by PyTorch but unallocated
    allowed: int | None = None  # the allocator's cap (a memory fraction), when one is set

    def held(self, context: int) -> int | None:
        """What the allocator held: allocated + cached, else the driver's figure less the
        CUDA context; None when the message says neither."""
        if self.allocated is not None and self.cached is not None:
            return self.allocated + self.cached
        if self.in_use is not None:
            return max(self.in_use - context, 0)
        return None

    def crept(self, context: int, old_budget: int) -> bool:
        """Whether the job ran into its cap in small steps: what it held filled most of
        its budget and the failing allocation was small beside it."""
        held = self.held(context)
        return (
            held is not None
            and held >= (1 - 2 * CREEP_STEP) * old_budget
            and self.tried <= CREEP_STEP * held
        )

    def need(self, context: int) -> int:
        """What the allocator would have held had the allocation succeeded (at least the
        allocation itself when the message says nothing of what was held)."""
        return (self.held(context) or 0) + self.tried


def parse_oom(output_tail: str) -> OomAsk | None:
    """The OOM message in the job's output that asked for the most (ranks of a multi-GPU
    job each print one), or None when no line says "Tried to allocate"."""
    best: OomAsk | None = None
    for line in output_tail.splitlines():
        tried = _TRIED.search(line)
        if tried is None:
            continue
        in_use, split, old, allowed = (p.search(line) for p in (_IN_USE, _SPLIT, _OLD, _ALLOWED))
        allocated = cached = None
        if split is not None:
            allocated, cached = _bytes(*split.group(1, 2)), _bytes(*split.group(3, 4))
        elif old is not None:
            allocated = _bytes(*old.group(1, 2))
            cached = max(_bytes(*old.group(3, 4)) - allocated, 0)
        ask = OomAsk(
            tried=_bytes(*tried.group(1, 2)),
            in_use=None if in_use is None else _bytes(*in_use.group(1, 2)),
            allocated=allocated,
            cached=cached,
            allowed=None if allowed is None else _bytes(*allowed.group(1, 2)),
        )
        if best is None or ask.need(0) > best.need(0):
            best = ask
    return best


def describe_ask(ask: OomAsk, context: int) -> str:
    """What the message asked for, for people: the allocation, what was held, the sum."""
    held = ask.held(context)
    return (
        f"it tried to allocate {format_bytes(ask.tried)}"
        + ("" if held is None else f" holding {format_bytes(held)}")
        + f": needs {format_bytes(ask.need(context))}"
    )


def shown_need(ask: OomAsk | None, peak: int | None, context: int) -> int | None:
    """What the job was shown to need per GPU, as its allocator counts (the budget's
    semantics): the message's need, or the sampled peak less the CUDA context (NVML's
    figure includes it) when that is more; None when neither says anything."""
    known = [
        n
        for n in (
            None if ask is None else ask.need(context),
            None if peak is None else max(peak - context, 0),
        )
        if n is not None
    ]
    return max(known) if known else None


def _whole_mib(n: float) -> int:
    return -(-int(n) // (1 << 20)) * (1 << 20)


def retry_budget(*, old_budget: int, need: int | None, largest: int, crept: bool = False) -> int:
    """The budget a retry gets: what the job was shown to need plus MARGIN (CREEP_MIN ×
    when it crept into its cap), at least GROWTH × the old budget, in whole MiB, capped
    by the largest GPU's capacity."""
    shown = (CREEP_MIN if crept else 1 + MARGIN) * need if need else 0
    return min(_whole_mib(max(GROWTH * old_budget, shown)), largest)


def retry_ceiling(*, budget: int, need: int | None, largest: int) -> int:
    """The most a crept job's retry may take where the GPU has room (CREEP_CEILING ×
    what it reached, never less than its budget, capped by the largest GPU)."""
    return max(budget, min(_whole_mib(CREEP_CEILING * (need or budget)), largest))


@dataclass(frozen=True)
class Retry:
    """Decision: queue the job again with ``budget`` bytes per GPU after ``delay`` s
    (0: at once, waiting only for room). ``need``: what the job was shown to need;
    ``ceiling``: for a job that crept into its cap, the most it may be given where
    there is room (None: exactly ``budget``)."""

    budget: int
    delay: float
    need: int | None = None
    ceiling: int | None = None


@dataclass(frozen=True)
class GiveUp:
    """Decision: the OOM failure stands; ``reason`` says why no retry."""

    reason: str


def after_oom(
    *,
    old_budget: int | None,
    peak: int | None,
    largest: int,
    used: int,
    allowed: int,
    backoff: float,
    ask: OomAsk | None = None,
    context: int = 0,
) -> Retry | GiveUp:
    """An OOM failure with ``used`` of ``allowed`` retries spent, ``ask`` parsed from its
    message, ``peak`` sampled (NVML's figure) and ``context`` the CUDA context allowance.
    A bigger budget (retry_budget) is tried at once: waiting would not make it fit
    better; a job that crept into its cap (OomAsk.crept) asks twice what it reached and
    may take up to four times that. Only a job already at the largest budget that was
    within it (the GPU ran out, not its budget) is retried at the same budget, after a
    doubling backoff. A job that had a whole GPU cannot get more."""
    if used >= allowed:
        return GiveUp(
            f"out of retries ({used} of {allowed} used)"
            if allowed
            else "no retries asked for (--retries)"
        )
    if old_budget is None:
        return GiveUp("it had a whole GPU: there is no bigger budget to retry with")
    need = shown_need(ask, peak, context)
    crept = ask is not None and ask.crept(context, old_budget)
    budget = retry_budget(old_budget=old_budget, need=need, largest=largest, crept=crept)
    if budget > old_budget:
        ceiling = retry_ceiling(budget=budget, need=need, largest=largest) if crept else None
        return Retry(
            budget=budget,
            delay=0.0,
            need=need,
            ceiling=ceiling if ceiling and ceiling > budget else None,
        )
    if need is not None and need <= old_budget:
        return Retry(budget=old_budget, delay=backoff * (2**used), need=need)
    return GiveUp(
        "its budget is already the largest a GPU here can give"
        + ("" if need is None else f" (it needs {format_bytes(need)})")
    )
