"""Queue policy: the order jobs are considered in, and one scheduling pass over them.

Order and fit are separate, replaceable functions (``plan``'s ``ordering`` and ``fit``),
so aging/QoS can swap the order and preemption can swap the fit without touching the
pass that keeps invariant 1: every Place is booked into the GPU states before the next
job is considered, so one pass never overbooks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gpuwarden.sched.model import Decision, GpuState, Infeasible, Place, QueuedJob, Wait
from gpuwarden.sched.placement import (
    DEFAULT_SPIKE_BUFFER,
    apply,
    fits,
    infeasible_reason,
    wait_reason,
)

Ordering = Callable[[Iterable[QueuedJob]], list[QueuedJob]]
"""Turns the queue into the order a pass considers it in."""
Fit = Callable[[QueuedJob, Sequence[GpuState], float], Place | None]
"""Where one job fits given the GPU states, or None (``placement.fits``)."""


def order_key(job: QueuedJob) -> tuple[int, float, int]:
    """Higher priority first, then earlier submission, then lower id (a total order, so a
    pass is deterministic)."""
    return -job.priority, job.submitted_at, job.id


def order(queue: Iterable[QueuedJob]) -> list[QueuedJob]:
    """The basic order: priority, then submit time. The next issue replaces it (aging,
    QoS) through ``plan``'s ``ordering``."""
    return sorted(queue, key=order_key)


def plan(gpus: Sequence[GpuState], queue: Iterable[QueuedJob],
         spike_buffer: float = DEFAULT_SPIKE_BUFFER, *, ordering: Ordering = order,
         fit: Fit = fits) -> list[Decision]:
    """One scheduling pass: a decision per queued job, in the order considered.

    Backfill is basic: when the head job waits, later (smaller) jobs that fit now still
    start. That may delay the head job's earliest start; the next issue constrains
    backfill so it may not (a different ``fit``/``ordering`` or a wrapper around this)."""
    state = list(gpus)
    decisions: list[Decision] = []
    seen: set[int] = set()
    for job in ordering(queue):
        if job.id in seen:  # one decision per job, even if the queue lists it twice
            continue
        seen.add(job.id)
        reason = infeasible_reason(job, state)
        if reason is not None:
            decisions.append(Infeasible(job.id, reason))
            continue
        place = fit(job, state, spike_buffer)
        if place is None:
            decisions.append(Wait(job.id, wait_reason(job, state, spike_buffer)))
            continue
        state = apply(state, job, place, spike_buffer)
        decisions.append(place)
    return decisions
