"""Queue policy: the order jobs are considered in, and one scheduling pass over them.

A pass walks the queue in order (priority raised by aging, then QoS class, then
submission time) and gives every job one decision. Every Place is booked into the GPU
states before the next job is considered, so one pass never overbooks (invariant 1).
Around that core the policies of ``Policy`` apply, each in its own module:

- per-user limits (``limits.py``): a job that would take its user past a limit waits;
- backfill (``backfill.py``): the first job that waits for room gets a reservation, and
  later jobs start only if they cannot delay it;
- preemption (``preempt.py``): a job that does not fit may stop cheaper jobs of a lower
  class or priority; it then waits for them to go, and no other job takes their room.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpuwarden.sched import backfill, limits, preempt
from gpuwarden.sched.model import (
    QOS_RANK,
    Decision,
    GpuState,
    Infeasible,
    Preempt,
    QueuedJob,
    Wait,
)
from gpuwarden.sched.placement import (
    DEFAULT_SPIKE_BUFFER,
    apply,
    fits,
    infeasible_reason,
    release,
    wait_reason,
)
from gpuwarden.sched.queue_types import Fit, Ordering

__all__ = ["Fit", "Ordering", "Policy", "aged_order", "effective_priority", "order",
           "order_key", "plan"]


@dataclass(frozen=True)
class Policy:
    """What a pass may do beyond placing jobs that fit. ``aging``: seconds of waiting
    that raise a job's priority by one (0: no aging)."""

    aging: float = 0.0
    backfill: bool = True
    preemption: bool = True
    limits: limits.Limits = field(default_factory=limits.Limits)


def effective_priority(job: QueuedJob, now: float, aging: float) -> int:
    """The job's priority plus one for every ``aging`` seconds it has waited."""
    if aging <= 0:
        return job.priority
    return job.priority + int(max(now - job.submitted_at, 0.0) // aging)


def order_key(job: QueuedJob, now: float = 0.0, aging: float = 0.0,
              ) -> tuple[int, int, float, int]:
    """Higher (aged) priority first, then higher QoS class, then earlier submission,
    then lower id (a total order, so a pass is deterministic)."""
    return (-effective_priority(job, now, aging), -QOS_RANK.get(job.qos, 1),
            job.submitted_at, job.id)


def aged_order(now: float, aging: float) -> Ordering:
    def ordering(queue: Iterable[QueuedJob]) -> list[QueuedJob]:
        return sorted(queue, key=lambda j: order_key(j, now, aging))
    return ordering


def order(queue: Iterable[QueuedJob]) -> list[QueuedJob]:
    """The order without aging."""
    return sorted(queue, key=order_key)


def _when(ts: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ts))


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def plan(gpus: Sequence[GpuState], queue: Iterable[QueuedJob],
         spike_buffer: float = DEFAULT_SPIKE_BUFFER, *, now: float = 0.0,
         policy: Policy | None = None, ordering: Ordering | None = None,
         fit: Fit = fits) -> list[Decision]:
    """One scheduling pass: a decision per queued job, in the order considered."""
    pol = policy or Policy(backfill=False, preemption=False)
    state = list(gpus)
    held = limits.usage(state)
    head: backfill.Reservation | None = None
    stopping = preempt.in_flight(state)
    decisions: list[Decision] = []
    seen: set[int] = set()
    placed: set[int] = set()  # placed in this pass: not yet running, never victims
    for job in (ordering or aged_order(now, pol.aging))(queue):
        if job.id in seen:  # one decision per job, even if the queue lists it twice
            continue
        seen.add(job.id)
        reason = infeasible_reason(job, state)
        if reason is not None:
            decisions.append(Infeasible(job.id, reason))
            continue
        if job.not_before > now:
            decisions.append(Wait(job.id, f"retry backs off until {_when(job.not_before)}",
                                  "backoff"))
            continue
        over = limits.over_limit(job, job.mem, held, pol.limits)
        if over is not None:
            decisions.append(Wait(job.id, f"waiting: {over}", "limit"))
            continue
        place = fit(job, state, spike_buffer)
        if place is not None:
            over = limits.over_limit(job, place.budget, held, pol.limits)
            if over is not None:
                decisions.append(Wait(job.id, f"waiting: {over}", "limit"))
                continue
            if head is not None and pol.backfill:
                ok, head_after = backfill.admits(head, job, place, now, spike_buffer, fit)
                if not ok:
                    decisions.append(Wait(job.id, f"waiting: starting now would delay job "
                                                  f"{head.job.id}, first in the queue",
                                          "backfill"))
                    continue
                head = head_after
            state = apply(state, job, place, spike_buffer, started_at=now)
            placed.add(job.id)
            held = limits.book(held, job, place)
            decisions.append(place)
            continue
        # It does not fit now.
        if stopping and fit(job, release(state, stopping), spike_buffer) is not None:
            decisions.append(Wait(job.id, f"waiting for preempted job(s) {_ids(stopping)} "
                                          "to stop", "preemption"))
            if head is None:
                head = backfill.reserve(job, state, now, spike_buffer, fit)
            continue
        if pol.preemption:
            victims = preempt.victims(job, state, now, spike_buffer, fit, spare=placed)
            if victims:
                why = (f"job {job.id} ({job.qos}, priority {job.priority}) needs the room")
                decisions.append(Preempt(job.id, victims, why))
                stopping = stopping | set(victims)
                state = [g if not any(u.job_id in victims for u in g.managed) else
                         _mark_stopping(g, set(victims)) for g in state]
                if head is None:
                    head = backfill.reserve(job, state, now, spike_buffer, fit)
                continue
        why = wait_reason(job, state, spike_buffer)
        if head is None and pol.backfill:
            head = backfill.reserve(job, state, now, spike_buffer, fit)
            if head is not None and head.shadow is not None and head.shadow > now:
                why += f"; first in line, expected to start by {_when(head.shadow)}"
        decisions.append(Wait(job.id, why))
    return decisions


def _mark_stopping(gpu: GpuState, victims: set[int]) -> GpuState:
    return replace(gpu, managed=tuple(replace(u, preempting=True) if u.job_id in victims
                                      else u for u in gpu.managed))
