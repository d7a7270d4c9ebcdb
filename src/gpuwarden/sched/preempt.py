"""Preemption: which running jobs to stop so that a waiting job of a higher class or
priority can start, as a pure choice over GPU states.

Who may stop whom: a guaranteed job is never stopped; a job may stop another of a lower
QoS class (besteffort < burstable < guaranteed), or of the same class and a lower
priority. Cost, cheapest first: lowest class, then jobs using more than they asked for
(a burstable job over its request is stopped before one within it), then lowest
priority, then least run time lost (the most recently started). Victims are added in
that order until the job fits, then any that turn out not to be needed are dropped
again, most expensive first."""

from __future__ import annotations

from collections.abc import Sequence, Set

from gpuwarden.jobs.request import GUARANTEED
from gpuwarden.sched.booking import claims, release
from gpuwarden.sched.model import QOS_RANK, GpuState, ManagedUse, QueuedJob
from gpuwarden.sched.queue_types import Fit


def may_preempt(job: QueuedJob, victim: ManagedUse) -> bool:
    if victim.qos == GUARANTEED:
        return False
    mine, theirs = QOS_RANK.get(job.qos, 1), QOS_RANK.get(victim.qos, 1)
    return theirs < mine or (theirs == mine and victim.priority < job.priority)


def over_request(uses: Sequence[ManagedUse]) -> bool:
    """The job uses more than its reservation on some GPU (burst)."""
    return any(u.used is not None and u.used > u.budget + u.context for u in uses)


def cost(uses: Sequence[ManagedUse], now: float) -> tuple[int, int, int, float, int]:
    """Sort key of a candidate victim, cheapest first."""
    u = uses[0]
    lost = now - u.started_at if u.started_at is not None else 0.0
    return (QOS_RANK.get(u.qos, 1), 0 if over_request(uses) else 1, u.priority, lost, -u.job_id)


def in_flight(gpus: Sequence[GpuState]) -> set[int]:
    """Jobs already being preempted (stopping, their memory not yet back)."""
    return {jid for jid, uses in claims(gpus).items() if uses[0].preempting}


def victims(
    job: QueuedJob,
    gpus: Sequence[GpuState],
    now: float,
    spike_buffer: float,
    fit: Fit,
    *,
    spare: Set[int] = frozenset(),
) -> tuple[int, ...] | None:
    """The cheapest set of running jobs whose end lets ``job`` fit, or None when no set
    of jobs it may preempt would do. Jobs already being preempted count as gone; jobs in
    ``spare`` (placed in this very pass) are never chosen."""
    gone = in_flight(gpus)
    held = claims(gpus)
    cands = sorted(
        (
            jid
            for jid, uses in held.items()
            if jid not in gone and jid not in spare and all(may_preempt(job, u) for u in uses)
        ),
        key=lambda jid: cost(held[jid], now),
    )
    chosen: list[int] = []
    for jid in cands:
        chosen.append(jid)
        if fit(job, release(gpus, gone | set(chosen)), spike_buffer) is not None:
            break
    else:
        return None
    for jid in reversed(list(chosen)):  # drop victims that turn out unneeded
        rest = [j for j in chosen if j != jid]
        if fit(job, release(gpus, gone | set(rest)), spike_buffer) is not None:
            chosen = rest
    return tuple(sorted(chosen))
