"""MPS facts: which control daemons and servers run, for whom, with which limits.

(Control of MPS — start, stop, limits — is added below the facts by the settings layer.)"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MpsDaemon:
    """One nvidia-cuda-mps-control (kind "control") or nvidia-cuda-mps-server ("server")."""

    pid: int
    kind: str
    user: str | None = None
    uid: int | None = None
    pipe_dir: str | None = None  # CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps
    log_dir: str | None = None
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES the daemon was started with
    pinned_mem_limit: str | None = None  # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, as set
    active_thread_percentage: str | None = None


@dataclass(frozen=True)
class MpsState:
    daemons: tuple[MpsDaemon, ...] = field(default_factory=tuple)

    @property
    def controls(self) -> tuple[MpsDaemon, ...]:
        return tuple(d for d in self.daemons if d.kind == "control")

    @property
    def servers(self) -> tuple[MpsDaemon, ...]:
        return tuple(d for d in self.daemons if d.kind == "server")
