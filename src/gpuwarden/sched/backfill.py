"""Backfill that never delays the head job (EASY backfill, after Slurm's and Maui's).

When the first job in queue order cannot start, it gets a reservation: the earliest time
it could start if running jobs end when their ``--timeout`` says they must at the latest
(its *shadow time*), and the GPU states at that time. A later job may still start now
("backfill") only if it cannot delay that start: it ends before the shadow time (its own
``--timeout`` says so), or the head job still fits at the shadow time with it running.

A job without a timeout runs, as far as planning knows, forever; when the head job's
start depends on such a job, the shadow time is unknown and taken to be *now* (it might
end any moment): then only jobs that leave the head job's room alone may backfill. That
is the conservative choice the queue makes without estimates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.sched.model import GpuState, ManagedUse, Place, QueuedJob
from gpuwarden.sched.placement import apply, claims, release
from gpuwarden.sched.queue_types import Fit


@dataclass(frozen=True)
class Reservation:
    """The head job's promise: it can start at ``shadow`` (None: unknown, treated as
    now) in the GPU states ``at_shadow``."""

    job: QueuedJob
    shadow: float | None
    at_shadow: tuple[GpuState, ...]


def _end(use: ManagedUse, now: float) -> float:
    if use.preempting:
        return now  # being stopped now
    if use.ends_at is None:
        return float("inf")
    return max(use.ends_at, now)  # past its limit: being stopped now


def reserve(job: QueuedJob, gpus: Sequence[GpuState], now: float, spike_buffer: float,
            fit: Fit) -> Reservation | None:
    """The head job's reservation, or None when it would not fit even with every managed
    job gone (then what blocks it is outside the queue: nothing to protect)."""
    ends = sorted((_end(uses[0], now), jid) for jid, uses in claims(gpus).items())
    state = list(gpus)
    if fit(job, state, spike_buffer) is not None:
        return Reservation(job, now, tuple(state))
    gone: set[int] = set()
    for i, (end, jid) in enumerate(ends):
        gone.add(jid)
        if i + 1 < len(ends) and ends[i + 1][0] == end:
            continue  # jobs that end at the same time free their room together
        state = release(gpus, gone)
        if fit(job, state, spike_buffer) is not None:
            return Reservation(job, None if end == float("inf") else end, tuple(state))
    return None


def admits(res: Reservation, job: QueuedJob, place: Place, now: float,
           spike_buffer: float, fit: Fit) -> tuple[bool, Reservation]:
    """May ``job`` start now at ``place`` without delaying the reserved job? Returns the
    answer and the reservation with the job booked in, when it is still running then."""
    end = now + job.runtime if job.runtime is not None else None
    if res.shadow is not None and end is not None and end <= res.shadow:
        return True, res  # gone before the head job's start
    try:
        later = apply(res.at_shadow, job, place, spike_buffer)
    except ValueError:
        return False, res
    if fit(res.job, later, spike_buffer) is None:
        return False, res
    return True, Reservation(res.job, res.shadow, tuple(later))
