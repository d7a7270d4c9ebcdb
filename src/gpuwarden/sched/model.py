"""Inputs and decisions of placement: plain values, so policies test without processes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ManagedUse:
    """A reserved or running managed job's claim on one GPU."""

    job_id: int
    budget: int  # bytes
    exclusive: bool = False


@dataclass(frozen=True)
class GpuState:
    """One GPU as placement sees it."""

    index: int
    uuid: str
    total: int
    reserve: int = 0  # driver/context reserve never given to jobs
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] = ()
    compute_mode: str = "Default"
    managed: tuple[ManagedUse, ...] = ()
    foreign_peak: int = 0  # bytes used by processes gpuwarden does not manage, at their peak
    foreign_processes: int = 0


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for GPUs, as the queue policy sees it."""

    id: int
    user: str
    mem: int | None  # bytes per GPU; None: a whole idle GPU
    count: int = 1
    gpu_ids: tuple[int, ...] | None = None
    exclusive: bool = False
    priority: int = 0
    submitted_at: float = 0.0


@dataclass(frozen=True)
class Place:
    """Decision: reserve ``budget`` bytes on each of ``gpus`` for the job, then launch."""

    job_id: int
    gpus: tuple[int, ...]
    budget: int


@dataclass(frozen=True)
class Wait:
    """Decision: the job stays queued; ``reason`` says why (shown to the user)."""

    job_id: int
    reason: str


@dataclass(frozen=True)
class Infeasible:
    """Decision: the job can never run here, even on empty GPUs."""

    job_id: int
    reason: str


Decision = Place | Wait | Infeasible
