"""Backfill that never lets the queue wait behind a job it cannot place (EASY backfill,
after Slurm's and Maui's, on expected run times, with a starvation guard).

When the first job in queue order cannot start, it gets a reservation: the earliest time
it could start if running jobs end when expected (its *shadow time*), and the GPU states
at that time. A job is expected to end at its start plus its expected run time: the
shorter of its estimate (learned from earlier runs of the same key or name) and its
``--timeout`` (a bound: it is stopped then). An estimate may be wrong: a job past its
estimate and without a timeout may end any moment, or never; its end is unknown, as is
the end of a job with neither.

A later job may still start now ("backfill") if it cannot delay that start: it is
expected to end before the shadow time, or the head job still fits at the shadow time
with it running. When the head job's start depends on a job whose end is unknown, the
shadow time is unknown too, and holding room for it would block the queue for as long as
that job runs: then jobs that fit start now, until the head job has waited
``starve_after``. From then on the shadow time is taken to be *now* (the blocking job
might end any moment) and only jobs that leave the head job's room alone may start. A
service coming back (restarted, or retried after an OOM) has its room held at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.sched.booking import apply, claims, release
from gpuwarden.sched.model import GpuState, ManagedUse, Place, QueuedJob
from gpuwarden.sched.queue_types import Fit


@dataclass(frozen=True)
class Reservation:
    """The head job's promise: it can start at ``shadow`` (None: unknown, treated as
    now) in the GPU states ``at_shadow``."""

    job: QueuedJob
    shadow: float | None
    at_shadow: tuple[GpuState, ...]


def expected_end(use: ManagedUse, now: float) -> float:
    """When a running job is expected to end (inf: unknown)."""
    if use.preempting or use.ended:
        return now  # being stopped now, or its memory coming back
    if use.expected_end is not None and use.expected_end > now:
        return use.expected_end
    if use.ends_at is None:
        return float("inf")  # no estimate, or past it with no bound
    return max(use.ends_at, now)  # past its limit: being stopped now


def starving(job: QueuedJob, now: float, starve_after: float) -> bool:
    """Is the head job's room held even without a known start? When it has waited
    ``starve_after``, and at once for a service coming back: it held that room before."""
    return job.returning or now - job.submitted_at >= starve_after


def reserve(
    job: QueuedJob, gpus: Sequence[GpuState], now: float, spike_buffer: float, fit: Fit
) -> Reservation | None:
    """The head job's reservation, or None when it would not fit even with every managed
    job gone (then what blocks it is outside the queue: nothing to protect)."""
    ends = sorted((expected_end(uses[0], now), jid) for jid, uses in claims(gpus).items())
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


def admits(
    res: Reservation,
    job: QueuedJob,
    place: Place,
    now: float,
    spike_buffer: float,
    fit: Fit,
    starve_after: float,
) -> tuple[bool, Reservation]:
    """May ``job`` start now at ``place`` without delaying the reserved job? Returns the
    answer and the reservation with the job booked in, when it is still running then. An
    unknown shadow time holds nothing until the head job has waited ``starve_after``."""
    if res.shadow is None and not starving(res.job, now, starve_after):
        return True, res
    runtime = job.expected_runtime
    if res.shadow is not None and runtime is not None and now + runtime <= res.shadow:
        return True, res  # gone before the head job's start
    try:
        later = apply(res.at_shadow, job, place, spike_buffer)
    except ValueError:
        return False, res
    if fit(res.job, later, spike_buffer) is None:
        return False, res
    return True, Reservation(res.job, res.shadow, tuple(later))
