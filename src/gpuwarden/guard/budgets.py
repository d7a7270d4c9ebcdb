"""Memory budgets inside one process: named shares of a GPU that the tasks of one
program (an encoder, a generator, a cache) claim before they allocate, so that a process
serving several models refuses the one that does not fit, with the numbers, instead of
running out of memory later in a neighbour's step.

    budgets = MemoryBudgets()
    with budgets.budget("encoder", "8G", device=0):
        ...                                   # load and run within 8 GiB
    print(budgets.usage(0))                   # allocated, reserved, free, budgeted

What budgets may add up to on a GPU (its *limit*): the job's budget per GPU when the job
daemon started this process (GPUWARDEN_BUDGET), else the GPU's memory less what other
processes hold now. A reserve (by default the CUDA context allowance) stays out of every
budget. Budgets are admission control: PyTorch cannot cap one thread's allocations, so a
budget is a promise checked when it is made, with figures to watch it; the hard cap on
the whole process is the daemon's (or the worker pool's)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpuwarden.errors import GpuwardenError, UsageError
from gpuwarden.guard.memory import (
    DriverProbe,
    MemoryProbe,
    MemoryReading,
    context_allowance,
    job_budget,
)
from gpuwarden.guard.oom import free_memory
from gpuwarden.units import format_bytes, parse_size

Size = int | str


class BudgetExceeded(GpuwardenError):
    """A budget that would take the GPU past what this process may use."""

    exit_code = 1


@dataclass(frozen=True)
class Budget:
    """A named share of one GPU, held until released."""

    name: str
    device: int
    size: int
    owner: MemoryBudgets = field(repr=False, compare=False)

    def release(self) -> None:
        self.owner.release(self.name)

    def __enter__(self) -> Budget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class BudgetUsage:
    """One GPU's figures for people and for checks; bytes."""

    reading: MemoryReading
    limit: int  # what budgets may add up to, the reserve included
    reserve: int
    budgets: dict[str, int]
    under_daemon: bool

    @property
    def budgeted(self) -> int:
        return sum(self.budgets.values())

    @property
    def available(self) -> int:
        """What a new budget may still take."""
        return max(0, self.limit - self.reserve - self.budgeted)

    def __str__(self) -> str:
        r = self.reading
        torch = (
            "PyTorch: CUDA not initialised"
            if r.allocated is None
            else f"PyTorch allocated {format_bytes(r.allocated)}, "
            f"reserved {format_bytes(r.reserved)}"
        )
        source = "job budget" if self.under_daemon else "left by other processes"
        return (
            f"cuda:{r.device} (GPU {r.index}): {len(self.budgets)} budgets, "
            f"{format_bytes(self.budgeted)} of {format_bytes(self.limit)} ({source}; "
            f"reserve {format_bytes(self.reserve)}), {format_bytes(self.available)} "
            f"available; {torch}; GPU free {format_bytes(r.free)} of "
            f"{format_bytes(r.total)}"
        )


class MemoryBudgets:
    """A thread-safe registry of named budgets per device. ``reserve``: bytes kept out
    of every budget on each GPU (default: the CUDA context allowance; none under the
    daemon, whose job budget is what allocations may hold, the context booked beside
    it). ``probe`` and ``env`` are injectable for tests; by default the driver is read
    through gpuwarden's backend and the environment is this process's."""

    def __init__(
        self,
        *,
        reserve: Size | None = None,
        probe: MemoryProbe | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.env = os.environ if env is None else env
        if reserve is not None:
            self.reserve = parse_size(reserve)
        else:  # under the daemon the context is booked beside the job's budget
            self.reserve = 0 if job_budget(self.env) is not None else context_allowance(self.env)
        self.probe = probe if probe is not None else DriverProbe(self.env)
        self._budgets: dict[str, Budget] = {}
        self._lock = threading.Lock()

    def _usage(self, device: int) -> BudgetUsage:
        reading = self.probe.read(device)
        daemon = job_budget(self.env)
        limit = daemon if daemon is not None else reading.total - reading.others
        mine = {b.name: b.size for b in self._budgets.values() if b.device == device}
        return BudgetUsage(
            reading=reading,
            limit=limit,
            reserve=self.reserve,
            budgets=mine,
            under_daemon=daemon is not None,
        )

    def usage(self, device: int = 0) -> BudgetUsage:
        """Budgets, allocator and driver figures for one GPU."""
        with self._lock:
            return self._usage(device)

    def register(self, name: str, size: Size, device: int = 0) -> Budget:
        """Claim ``size`` (bytes, "8G" or a fraction of the limit such as 0.25) on
        ``device``; BudgetExceeded, with the figures, when it does not fit."""
        if not name:
            raise UsageError("a budget needs a name")
        with self._lock:
            if name in self._budgets:
                raise UsageError(
                    f"budget {name!r} is registered already "
                    f"({format_bytes(self._budgets[name].size)} on "
                    f"cuda:{self._budgets[name].device})"
                )
            usage = self._usage(device)
            nbytes = parse_size(size, total=usage.limit)
            if nbytes <= 0:
                raise UsageError(f"budget {name!r}: the size must be more than 0")
            if nbytes > usage.available:
                raise BudgetExceeded(
                    f"budget {name!r} of {format_bytes(nbytes)} does not fit on cuda:"
                    f"{device}: {format_bytes(usage.available)} available = "
                    f"{format_bytes(usage.limit)} "
                    f"{'job budget' if usage.under_daemon else 'left by other processes'}"
                    f" - {format_bytes(usage.reserve)} reserve - "
                    f"{format_bytes(usage.budgeted)} in {len(usage.budgets)} budgets"
                )
            budget = Budget(name=name, device=device, size=nbytes, owner=self)
            self._budgets[name] = budget
            return budget

    def release(self, name: str) -> None:
        """Drop a budget and hand freed memory back (``free_memory``)."""
        with self._lock:
            if self._budgets.pop(name, None) is None:
                raise UsageError(f"no budget named {name!r}")
        free_memory()

    @contextmanager
    def budget(self, name: str, size: Size, device: int = 0) -> Iterator[Budget]:
        """``with budgets.budget("encoder", "8G"):`` — registered for the block."""
        held = self.register(name, size, device)
        try:
            yield held
        finally:
            held.release()

    def budgets(self) -> list[Budget]:
        with self._lock:
            return sorted(self._budgets.values(), key=lambda b: (b.device, b.name))

    def get(self, name: str) -> Budget:
        with self._lock:
            try:
                return self._budgets[name]
            except KeyError:
                raise UsageError(f"no budget named {name!r}") from None
