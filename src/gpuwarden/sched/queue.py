"""Queue policy: the order jobs are considered in, and one scheduling pass over them.

A pass walks the queue in order (services coming back first, then priority raised by
aging, then QoS class, then its user's fair-share usage, then submission time) and gives
every job one decision. Every
Place is booked into the GPU states before the next job is considered, so one pass never
overbooks (invariant 1); a service backing off before its restart has its room booked
too.
Around that core the policies of ``Policy`` apply, each in its own module:

- per-user limits (``limits.py``): a job that would take its user past a limit waits;
- backfill (``backfill.py``): the first job that waits for room gets a reservation, and
  later jobs start only if they cannot delay it (or, while its start is unknown, until it
  has waited ``starve_after``); among the later jobs that fit, those that fill the GPUs
  best start first (``BEST_FIT_WINDOW``);
- preemption (``preempt.py``): a job that does not fit may stop cheaper jobs of a lower
  class or priority; it then waits for them to go, and no other job takes their room.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpuwarden.sched import backfill, limits, preempt
from gpuwarden.sched.booking import apply, release
from gpuwarden.sched.headroom import DEFAULT_SPIKE_BUFFER, headroom
from gpuwarden.sched.model import (
    QOS_RANK,
    Decision,
    GpuState,
    Infeasible,
    Place,
    Preempt,
    QueuedJob,
    Wait,
)
from gpuwarden.sched.placement import fits, infeasible_reason, wait_reason
from gpuwarden.sched.queue_types import Fit, Ordering
from gpuwarden.units import format_duration

__all__ = [
    "BEST_FIT_WINDOW",
    "DEFAULT_STARVE_AFTER",
    "Fit",
    "Ordering",
    "Policy",
    "aged_order",
    "effective_priority",
    "order",
    "order_key",
    "plan",
]

DEFAULT_STARVE_AFTER = 900.0
"""Seconds the first waiting job waits, when its start is unknown, before room is held."""
BEST_FIT_WINDOW = 4
"""Behind a waiting job, the next this-many jobs that fit are weighed against each other:
the one that leaves the least room unused on its GPUs starts first. Bounded, so a pass
stays linear in the queue and no job is passed over by more than this many. Wider
windows pack tighter and make small jobs wait longer (bench/RESULTS.md, section 6)."""


@dataclass(frozen=True)
class Policy:
    """What a pass may do beyond placing jobs that fit. ``aging``: seconds of waiting
    that raise a job's priority by one (0: no aging). ``starve_after``: seconds the first
    waiting job, when its start is unknown, lets jobs that fit go first (0: never).
    ``fairshare_halflife``: how fast a user's usage fades in the queue's order."""

    aging: float = 0.0
    fairshare_halflife: float = 0.0  # seconds; 0: no fair share (sched/fairshare.py)
    backfill: bool = True
    preemption: bool = True
    limits: limits.Limits = field(default_factory=limits.Limits)
    starve_after: float = DEFAULT_STARVE_AFTER


def effective_priority(job: QueuedJob, now: float, aging: float) -> int:
    """The job's priority plus one for every ``aging`` seconds it has waited."""
    if aging <= 0:
        return job.priority
    return job.priority + int(max(now - job.submitted_at, 0.0) // aging)


def order_key(
    job: QueuedJob,
    now: float = 0.0,
    aging: float = 0.0,
) -> tuple[bool, int, int, float, float, int]:
    """A service coming back (restarted, or retried after an OOM) first: it was admitted
    already and must not lose its room to work queued meanwhile, whatever its priority
    (docs/services.md). Then higher (aged) priority, higher QoS class, less fair-share
    usage of its user (sched/fairshare.py; 0 for all when it is off), earlier
    submission, lower id (a total order, so a pass is deterministic)."""
    return (
        not job.returning,
        -effective_priority(job, now, aging),
        -QOS_RANK.get(job.qos, 1),
        job.fair_usage,
        job.submitted_at,
        job.id,
    )


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


def plan(
    gpus: Sequence[GpuState],
    queue: Iterable[QueuedJob],
    spike_buffer: float = DEFAULT_SPIKE_BUFFER,
    *,
    now: float = 0.0,
    policy: Policy | None = None,
    ordering: Ordering | None = None,
    fit: Fit = fits,
) -> list[Decision]:
    """One scheduling pass: a decision per queued job, in the order decided. Jobs are
    considered in queue order; once one waits for room (and backfill is on), the jobs
    after it that may start are weighed in a window (``BEST_FIT_WINDOW``) and the best
    fitting goes first."""
    p = _Pass(
        list(gpus), spike_buffer, now, policy or Policy(backfill=False, preemption=False), fit
    )
    window: list[QueuedJob] = []
    seen: set[int] = set()
    for job in (ordering or aged_order(now, p.pol.aging))(queue):
        if job.id in seen:  # one decision per job, even if the queue lists it twice
            continue
        seen.add(job.id)
        got = p.consider(job)
        if got is None:
            continue
        if p.head is None or not p.pol.backfill:
            p.book(job, *got)  # in queue order until a job waits
            continue
        window.append(job)
        if len(window) == BEST_FIT_WINDOW:
            window = p.best_first(window, keep=BEST_FIT_WINDOW - 1)
    p.best_first(window, keep=0)
    p.give_spare_room()
    return p.decisions


class _Pass:
    """The state of one pass: the GPUs as booked so far, the users' holdings, the head
    job's reservation, the jobs being preempted, and the decisions made."""

    def __init__(
        self, state: list[GpuState], spike_buffer: float, now: float, pol: Policy, fit: Fit
    ) -> None:
        self.state = state
        self.spike = spike_buffer
        self.now = now
        self.pol = pol
        self.fit = fit
        self.held = limits.usage(state)
        self.head: backfill.Reservation | None = None
        self.stopping = preempt.in_flight(state)
        self.placed: set[int] = set()  # placed in this pass: not yet running, never victims
        self.ceilings: dict[int, QueuedJob] = {}  # placed jobs that may take more (OOM retries)
        self.decisions: list[Decision] = []

    def consider(
        self,
        job: QueuedJob,
    ) -> tuple[Place, backfill.Reservation | None] | None:
        """Where the job may start now (and the head's reservation once it does), or None
        when it may not: then its decision is made."""
        reason = infeasible_reason(job, self.state)
        if reason is not None:
            self.decisions.append(Infeasible(job.id, reason))
            return None
        if job.not_before > self.now:
            self._hold_backoff(job)
            self.decisions.append(
                Wait(job.id, f"retry backs off until {_when(job.not_before)}", "backoff")
            )
            return None
        over = limits.over_limit(job, job.mem, self.held, self.pol.limits)
        place = None if over is not None else self.fit(job, self.state, self.spike)
        if over is None and place is None:
            self._no_fit(job)
            return None
        if place is not None:
            over = limits.over_limit(job, place.budget, self.held, self.pol.limits)
        if over is not None or place is None:
            self.decisions.append(Wait(job.id, f"waiting: {over}", "limit"))
            return None
        head = self.head
        if head is not None and self.pol.backfill:
            ok, head = backfill.admits(
                head, job, place, self.now, self.spike, self.fit, self.pol.starve_after
            )
            if not ok:
                self.decisions.append(Wait(job.id, self._delays(head), "backfill"))
                return None
        return place, head

    def _hold_backoff(self, job: QueuedJob) -> None:
        """A service backing off before its restart keeps its room through the backoff:
        where it would be placed now is booked for the rest of the pass, so that no job
        after it takes that room in the seconds it waits."""
        if not job.returning:
            return
        place = self.fit(job, self.state, self.spike)
        if place is not None:
            self.state = apply(self.state, job, place, self.spike, started_at=self.now)

    def book(self, job: QueuedJob, place: Place, head: backfill.Reservation | None) -> None:
        self.state = apply(self.state, job, place, self.spike, started_at=self.now)
        self.placed.add(job.id)
        if job.mem_ceiling is not None and job.mem_ceiling > place.budget:
            self.ceilings[job.id] = job
        self.held = limits.book(self.held, job, place)
        self.head = head
        self.decisions.append(place)

    def give_spare_room(self) -> None:
        """Room on its GPUs that no job of the pass took goes to an OOM retry that crept
        into its cap, up to its ceiling (queue order among them). Its budget is a guess
        (sched/oom.py), so more room makes a second OOM less likely, but it never takes
        room a job that fits now could use, nor room the first waiting job holds."""
        if not self.ceilings or (self.head is not None and self._holds_room(self.head)):
            return
        for i, d in enumerate(self.decisions):
            if not isinstance(d, Place) or d.job_id not in self.ceilings:
                continue
            job = self.ceilings[d.job_id]
            assert job.mem_ceiling is not None
            spare = min(headroom(g, self.spike) for g in self.state if _on(g, d))
            more = min(job.mem_ceiling - d.budget, spare)
            allowed = limits.memory_left(job.user, self.held, self.pol.limits)
            if allowed is not None:
                more = min(more, allowed // len(d.gpus))
            if more <= 0:
                continue
            grown = replace(d, budget=d.budget + more)  # booked again: apply re-checks it
            self.state = apply(
                release(self.state, {job.id}), job, grown, self.spike, started_at=self.now
            )
            self.held = limits.grow(self.held, job.user, more * len(d.gpus))
            self.decisions[i] = grown

    def _holds_room(self, head: backfill.Reservation) -> bool:
        """Whether the first waiting job's reservation holds room now."""
        return self.pol.backfill and (
            head.shadow is not None or backfill.starving(head.job, self.now, self.pol.starve_after)
        )

    def best_first(self, window: list[QueuedJob], keep: int) -> list[QueuedJob]:
        """Start the best fitting of ``window`` (least headroom left on its GPUs, then
        queue order), weigh the rest again, until ``keep`` remain; returns them."""
        while len(window) > keep:
            options = []
            for i, job in enumerate(window):
                got = self.consider(job)
                if got is not None:
                    options.append((self._slack(got[0]), i, job, got))
            if not options:
                return []
            _, i, job, got = min(options, key=lambda o: o[:2])
            self.book(job, *got)
            window = [o[2] for o in options if o[2] is not job]
        return window

    def _slack(self, place: Place) -> int:
        """Headroom the placement leaves unused on its GPUs."""
        return sum(headroom(g, self.spike) - place.budget for g in self.state if _on(g, place))

    def _delays(self, head: backfill.Reservation) -> str:
        why = f"waiting: starting now would delay job {head.job.id}, first in the queue"
        if head.shadow is None:
            why += (
                f" (its room is held: it has waited over {format_duration(self.pol.starve_after)})"
            )
        return why

    def _no_fit(self, job: QueuedJob) -> None:
        state, spike, fit = self.state, self.spike, self.fit
        if self.stopping and fit(job, release(state, self.stopping), spike) is not None:
            self.decisions.append(
                Wait(
                    job.id,
                    f"waiting for preempted job(s) {_ids(self.stopping)} to stop",
                    "preemption",
                )
            )
            if self.head is None:
                self.head = backfill.reserve(job, state, self.now, spike, fit)
            return
        if self.pol.preemption:
            victims = preempt.victims(job, state, self.now, spike, fit, spare=self.placed)
            if victims:
                why = f"job {job.id} ({job.qos}, priority {job.priority}) needs the room"
                self.decisions.append(Preempt(job.id, victims, why))
                self.stopping = self.stopping | set(victims)
                self.state = [
                    g
                    if not any(u.job_id in victims for u in g.managed)
                    else _mark_stopping(g, set(victims))
                    for g in state
                ]
                if self.head is None:
                    self.head = backfill.reserve(job, self.state, self.now, spike, fit)
                return
        why = wait_reason(job, state, spike)
        if self.head is None and self.pol.backfill:
            self.head = backfill.reserve(job, state, self.now, spike, fit)
            if self.head is not None:
                why += self._first_in_line(self.head)
        self.decisions.append(Wait(job.id, why))

    def _first_in_line(self, head: backfill.Reservation) -> str:
        if head.shadow is not None:
            return (
                f"; first in line, expected to start by {_when(head.shadow)}"
                if head.shadow > self.now
                else ""
            )
        if backfill.starving(head.job, self.now, self.pol.starve_after):
            return "; first in line, its room is held"
        left = head.job.submitted_at + self.pol.starve_after - self.now
        if not math.isfinite(left):
            return "; first in line: jobs that fit start before it while its start is unknown"
        return (
            f"; first in line: jobs that fit start before it for {format_duration(left)}"
            f" more, then its room is held"
        )


def _on(gpu: GpuState, place: Place) -> bool:
    """Whether ``place`` books ``gpu`` (a MIG instance by its uuid)."""
    return gpu.uuid in place.uuids if place.uuids else gpu.index in place.gpus


def _mark_stopping(gpu: GpuState, victims: set[int]) -> GpuState:
    return replace(
        gpu,
        managed=tuple(
            replace(u, preempting=True) if u.job_id in victims else u for u in gpu.managed
        ),
    )


_SUCCESS, _ENDED = (
    frozenset({"succeeded"}),
    frozenset({"succeeded", "failed", "cancelled", "infeasible"}),
)
_FLAG = {"after": "--after", "after_any": "--after-any", "after_fail": "--after-fail"}


def dependency_state(kind: str, dep_id: int, state: str | None) -> tuple[bool, str | None]:
    """Whether a dependency of ``kind`` (after: success, after_any: any end, after_fail:
    an end without success) on job ``dep_id`` in ``state`` (None: removed) is met, and,
    when it can never be, why: (True, None) met, (False, None) not yet, (False, why)
    never."""
    if state is None:
        return False, f"dependency {dep_id} was removed"
    if state not in _ENDED:
        return False, None
    if kind == "after_any":
        return True, None
    if (state in _SUCCESS) == (kind == "after"):
        return True, None
    if kind == "after":
        return False, f"dependency {dep_id} {state}"
    return False, f"dependency {dep_id} {state}: {_FLAG[kind]} can never be met"
