"""Facts about one process, and about a process holding NVIDIA device files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Environment variables worth knowing for diagnosis; nothing else is read from environ.
INTERESTING_ENV = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "GPUWARDEN_JOB",
)


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says about a pid. ``exists`` False means no such process here."""

    pid: int
    exists: bool
    start_time: float | None = None  # epoch seconds; with pid, the identity of a process
    user: str | None = None
    uid: int | None = None
    command: str | None = None
    name: str | None = None
    status: str | None = None  # psutil status: running, sleeping, zombie, disk-sleep, ...
    ppid: int | None = None
    pgid: int | None = None
    group_leader_alive: bool | None = None
    parent_pgid: int | None = None
    cpus_allowed: frozenset[int] | None = None
    container: str | None = None
    nspid: tuple[int, ...] | None = None  # NSpid chain, outermost namespace first
    env: Mapping[str, str] | None = None  # only INTERESTING_ENV, None when unreadable
    uses_torch: bool | None = None
    garbage: bool = False  # an impossible pid (driver/struct mismatch)
    namespace_hint: str | None = None  # for invisible pids: who probably owns it
    rss: int | None = None  # bytes resident in host memory (top's RSS)
    cpu_time: float | None = None  # user + system CPU seconds so far (top's %CPU, by delta)

    @property
    def is_zombie(self) -> bool:
        return self.status == "zombie"

    @property
    def is_orphan(self) -> bool:
        """Left behind: the leader of its process group is dead and it was re-parented
        outside the group (to init or a subreaper). A daemon that detached on purpose is
        its own group leader, and a worker whose parent lives shares its parent's group."""
        return (
            self.exists
            and self.pgid is not None
            and self.pgid != self.pid
            and self.group_leader_alive is False
            and (self.ppid == 1 or (self.parent_pgid is not None and self.parent_pgid != self.pgid))
        )


@dataclass(frozen=True)
class Holder:
    """A process with NVIDIA device files open."""

    pid: int
    devices: tuple[str, ...]  # paths, sorted
    gpu_indices: tuple[int, ...]  # GPUs whose device node is among ``devices``
    user: str | None = None
    command: str | None = None
    start_time: float | None = None
    uses_uvm: bool = False  # holds /dev/nvidia-uvm (NVML opens it too, so not proof of CUDA)
    # /dev/nvidia* mapped into its memory: a CUDA context (its own or one inherited over
    # fork). None when unknown (not read, or no access to another user's maps).
    device_mapped: bool | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_monitor(self) -> bool:
        """A monitoring tool, harmless: it holds only control files, or it holds device
        nodes without mapping them (nvidia-smi, nvitop and exporters open /dev/nvidiaN and
        /dev/nvidia-uvm and even load libcuda through NVML, as seen on an H200 — but only a
        CUDA context maps the device files into memory)."""
        return not self.gpu_indices or self.device_mapped is False
