"""Booking: the GPU states as a pass books placements and drops claims. ``apply``
books a Place and re-checks that it asks no GPU more than its headroom, whatever policy
made it (docs/design.md, invariant 1); ``release`` drops ended jobs' claims;
``reservation`` is the claim one placed job holds on each of its GPUs, which the daemon
builds its GPU states with too. Apart from placement.py, which only decides where a job
fits, so the queue, backfill, preemption and limits share one ledger."""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import replace

from gpuwarden.sched.headroom import DEFAULT_SPIKE_BUFFER, headroom
from gpuwarden.sched.model import GpuState, ManagedUse, Place, QueuedJob
from gpuwarden.units import format_bytes


def reservation(
    job: QueuedJob,
    budget: int,
    *,
    started_at: float | None = None,
    used: int | None = None,
    preempting: bool = False,
    context: int = 0,
) -> ManagedUse:
    """The claim a placed job holds on each of its GPUs (whole-GPU jobs hold theirs alone).
    The daemon builds the ``managed`` input of ``gpu_states`` with this too: a job must
    end by its start plus its ``--timeout`` and is expected to by its start plus its
    expected run time."""
    ends = started_at + job.runtime if started_at is not None and job.runtime is not None else None
    expected = job.expected_runtime
    return ManagedUse(
        job_id=job.id,
        budget=budget,
        exclusive=job.alone,
        user=job.user,
        qos=job.qos,
        priority=job.priority,
        started_at=started_at,
        ends_at=ends,
        expected_end=None if started_at is None or expected is None else started_at + expected,
        used=used,
        preempting=preempting,
        context=context,
        service=job.service,
    )


def apply(
    gpus: Sequence[GpuState],
    job: QueuedJob,
    place: Place,
    spike_buffer: float = DEFAULT_SPIKE_BUFFER,
    *,
    started_at: float | None = None,
) -> list[GpuState]:
    """The GPU states after booking ``place``. Raises ValueError if the Place asks more
    than a GPU's headroom: the guard of invariant 1, whatever fit policy made it."""
    by_uuid = bool(place.uuids)  # a GPU's MIG instances share its index
    targets: set[int | str] = set(place.uuids) if by_uuid else set(place.gpus)
    out = []
    for gpu in gpus:
        if (gpu.uuid if by_uuid else gpu.index) in targets:
            room = headroom(gpu, spike_buffer)
            if place.budget + gpu.context > room or place.budget < 0:
                raise ValueError(
                    f"job {job.id}: {format_bytes(place.budget)} (+ "
                    f"{format_bytes(gpu.context)} context) on GPU {gpu.index} "
                    f"exceeds its headroom {format_bytes(room)}"
                )
            gpu = replace(
                gpu,
                managed=(
                    *gpu.managed,
                    reservation(job, place.budget, started_at=started_at, context=gpu.context),
                ),
            )
            targets.discard(gpu.uuid if by_uuid else gpu.index)
        if place.cpus and gpu.free_cpus is not None and gpu.free_cpus & set(place.cpus):
            gpu = replace(gpu, free_cpus=gpu.free_cpus - set(place.cpus))
        out.append(gpu)
    if targets:
        where = (
            ",".join(sorted(map(str, targets)))
            if by_uuid
            else ",".join(map(str, sorted(t for t in targets if isinstance(t, int))))
        )
        raise ValueError(f"job {job.id}: placed on unknown GPU {where}")
    return out


def release(gpus: Sequence[GpuState], job_ids: Set[int]) -> list[GpuState]:
    """The GPU states once the jobs ``job_ids`` have ended (their claims dropped)."""
    if not job_ids:
        return list(gpus)
    return [
        replace(g, managed=tuple(u for u in g.managed if u.job_id not in job_ids))
        if any(u.job_id in job_ids for u in g.managed)
        else g
        for g in gpus
    ]


def claims(gpus: Sequence[GpuState]) -> dict[int, list[ManagedUse]]:
    """Every managed job's claims, by job id (a multi-GPU job holds one per GPU)."""
    out: dict[int, list[ManagedUse]] = {}
    for g in gpus:
        for u in g.managed:
            out.setdefault(u.job_id, []).append(u)
    return out
