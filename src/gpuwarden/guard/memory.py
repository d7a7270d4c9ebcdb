"""What the guard reads about GPU memory: the driver's view (gpuwarden's backend — NVML,
or the simulated GPUs under GPUWARDEN_SIM) and PyTorch's allocator figures once the
program has initialised CUDA. Reading never initialises CUDA: a budget check must not
cost the process a CUDA context.

Devices are visible ordinals (what PyTorch calls ``cuda:N``), mapped to the machine's
GPUs through CUDA_VISIBLE_DEVICES as CUDA maps them. Under the job daemon the job's
budget per GPU comes from GPUWARDEN_BUDGET, so the guard and the daemon agree."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpuwarden.errors import UsageError
from gpuwarden.gpus.model import GpuFacts
from gpuwarden.gpus.visible import visible_gpus

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend

BUDGET_ENV = "GPUWARDEN_BUDGET"  # bytes per GPU, set by the job daemon
CONTEXT_ENV = "GPUWARDEN_CONTEXT_BYTES"  # the context allowance the daemon booked


def context_allowance(env: Mapping[str, str] | None = None) -> int:
    """Bytes to allow for the CUDA context: what the daemon booked for this job
    (GPUWARDEN_CONTEXT_BYTES), else the default allowance (sched/context.py)."""
    from gpuwarden.sched.context import DEFAULT_CONTEXT

    raw = (os.environ if env is None else env).get(CONTEXT_ENV, "").strip()
    try:
        return max(int(raw), 0) if raw else DEFAULT_CONTEXT
    except ValueError:
        return DEFAULT_CONTEXT


def job_budget(env: Mapping[str, str] | None = None) -> int | None:
    """The daemon job's budget per GPU in bytes (what its allocations may hold: the
    PyTorch cap), or None outside the daemon."""
    raw = (os.environ if env is None else env).get(BUDGET_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) == 0:
        raise UsageError(f"{BUDGET_ENV}={raw!r} is not a byte count")
    return int(raw)


def job_limit(env: Mapping[str, str] | None = None) -> int | None:
    """What the daemon job's process may take on each GPU as the driver counts it: its
    budget plus the CUDA context allowance booked beside it. None outside the daemon."""
    budget = job_budget(env)
    return None if budget is None else budget + context_allowance(env)


@dataclass(frozen=True)
class MemoryReading:
    """One GPU as this process sees it. Bytes; None where nobody could say."""

    device: int  # visible ordinal (cuda:N)
    index: int  # the machine's index (nvidia-smi's)
    uuid: str
    total: int
    free: int  # on the whole GPU, from the driver
    process: int | None  # this process on this GPU, as the driver counts it
    allocated: int | None  # PyTorch: in live tensors
    reserved: int | None  # PyTorch: held by the caching allocator
    cpus: str | None  # the GPU's local CPUs

    @property
    def own(self) -> int:
        """This process's footprint: the driver's figure, else PyTorch's reserved memory
        plus a context allowance once CUDA is up, else nothing."""
        if self.process is not None:
            return self.process
        if self.reserved is not None:
            return self.reserved + context_allowance()
        return 0

    @property
    def others(self) -> int:
        """What every other process (and leaked memory) holds on this GPU."""
        return max(0, self.total - self.free - self.own)


class MemoryProbe(Protocol):
    def read(self, device: int) -> MemoryReading: ...

    def gpu(self, device: int) -> GpuFacts: ...

    def device_count(self) -> int: ...


def torch_figures(device: int) -> tuple[int, int] | None:
    """(allocated, reserved) from PyTorch, only when the program already imported torch
    and initialised CUDA."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        return int(cuda.memory_allocated(device)), int(cuda.memory_reserved(device))
    except Exception:
        return None


class DriverProbe:
    """Reads through a gpuwarden backend opened on first use (thread-safe)."""

    def __init__(
        self, env: Mapping[str, str] | None = None, backend: Callable[[], Backend] | None = None
    ) -> None:
        self.env = os.environ if env is None else env
        self._open = backend
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    def backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                if self._open is not None:
                    self._backend = self._open()
                else:
                    from gpuwarden.gpus.backend import open_backend

                    self._backend = open_backend(self.env.get("GPUWARDEN_SIM", ""))
            return self._backend

    def _visible(self) -> list[GpuFacts]:
        return visible_gpus(self.backend().gpus(), self.env)

    def device_count(self) -> int:
        return len(self._visible())

    def gpu(self, device: int) -> GpuFacts:
        visible = self._visible()
        if not 0 <= device < len(visible):
            raise UsageError(
                f"no GPU cuda:{device}: this process sees {len(visible)}"
                + (
                    f" (CUDA_VISIBLE_DEVICES={self.env['CUDA_VISIBLE_DEVICES']})"
                    if "CUDA_VISIBLE_DEVICES" in self.env
                    else ""
                )
            )
        return visible[device]

    def read(self, device: int) -> MemoryReading:
        g = self.gpu(device)
        pid = os.getpid()
        mine = [
            p.memory
            for p in self.backend().processes()
            if p.pid == pid and p.gpu_index == g.index and p.memory is not None
        ]
        figures = torch_figures(device)
        return MemoryReading(
            device=device,
            index=g.index,
            uuid=g.uuid,
            total=g.memory_total,
            free=g.memory_free,
            process=sum(mine) if mine else None,
            allocated=figures[0] if figures else None,
            reserved=figures[1] if figures else None,
            cpus=g.cpus,
        )
