"""The backend protocol and how gpuwarden picks one: GPUWARDEN_SIM selects the
simulated backend, otherwise NVML."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from gpuwarden.gpus.model import GpuFacts, GpuProcessFacts
from gpuwarden.procs.model import Holder, ProcInfo


class ProcessSource(Protocol):
    """Where process facts come from: the real /proc, or the simulation's overlay of it."""

    @property
    def in_child_namespace(self) -> bool: ...

    def info(self, pid: int, *, detail: bool = True) -> ProcInfo: ...

    def device_mapped(self, pid: int) -> bool | None:
        """Whether a process has NVIDIA device files mapped, i.e. a CUDA context (None:
        unknown)."""
        ...

    def holders(
        self,
        device_files: Mapping[str, int | None],
        exclude: Iterable[int] = (),
        only: Collection[int] | None = None,
    ) -> list[Holder]:
        """Processes holding one of ``device_files``; ``only``: look at these pids alone
        (a re-check of the holders an earlier scan found), not all of /proc."""
        ...


class Backend(Protocol):
    """Facts about GPUs and the processes the driver lists. Implementations record
    non-fatal query failures in ``warnings`` instead of raising."""

    name: str
    warnings: list[str]

    def gpus(self) -> list[GpuFacts]: ...

    def processes(self) -> list[GpuProcessFacts]: ...

    def device_files(self) -> dict[str, int | None]:
        """Device file path -> GPU index (None for control files like nvidiactl)."""
        ...

    def process_source(self) -> ProcessSource: ...

    def driver_version(self) -> str | None: ...

    def set_compute_mode(self, index: int, mode: str) -> None: ...

    def close(self) -> None: ...


def simulated() -> bool:
    """Whether open_backend() opens the simulated backend (GPUWARDEN_SIM names a scenario):
    the one rule for whatever else is simulated with it (MPS daemons, settings)."""
    return bool(os.environ.get("GPUWARDEN_SIM"))


def open_backend(sim: str | None = None) -> Backend:
    """The simulated backend when ``sim`` or GPUWARDEN_SIM names a scenario, else NVML.
    Raises BackendUnavailable with a one-line reason when neither can be opened."""
    scenario = sim if sim is not None else os.environ.get("GPUWARDEN_SIM")
    if scenario:
        from gpuwarden.gpus.sim import SimBackend

        return SimBackend.from_file(scenario)
    from gpuwarden.gpus.nvml import NvmlBackend

    return NvmlBackend.open()
