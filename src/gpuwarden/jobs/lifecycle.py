"""A job's states and the events that move it between them: one table, which
``Store.transition`` enforces, so a state change not written here cannot happen, and
every event a job's history can hold is named here (``show`` and ``ps`` print them;
``wait``, accounting and restarts read them back by name). docs/design.md, invariant 2."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple

QUEUED, HELD, RESERVED, RUNNING = "queued", "held", "reserved", "running"
SUCCEEDED, FAILED, CANCELLED, INFEASIBLE = "succeeded", "failed", "cancelled", "infeasible"
STATES = (QUEUED, HELD, RESERVED, RUNNING, SUCCEEDED, FAILED, CANCELLED, INFEASIBLE)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, INFEASIBLE})
ACTIVE = frozenset({RESERVED, RUNNING})  # jobs that hold GPU budget

# Events that move a job (or mark an active one: a to-state of None keeps its state).
SUBMITTED = "submitted"
PLACED, LAUNCHED, ADOPTED, STARTED = "placed", "launched", "adopted", "started"
HELD_BY_USER, GROUP_HELD, RELEASED = "held", "group_held", "released"
# An attempt's end, named by the state it leaves the job in.
ENDED_SUCCEEDED, ENDED_FAILED, ENDED_CANCELLED = SUCCEEDED, FAILED, CANCELLED
RETRIED, REQUEUED, RESTARTED = "retried", "requeued", "restarted"
LOST, LAUNCH_FAILED, MADE_INFEASIBLE = "lost", "launch_failed", "infeasible"
DEPENDENCY_FAILED = "dependency_failed"
PREEMPTED, HEALTH_FAILED, KILLED_OVER_LIMIT = "preempted", "health_failed", "killed_over_limit"

# Events that change no state: notes on what happened to a job.
OOM, NOT_RETRIED, OVER_BUDGET, BUDGET_LEARNED = (
    "oom",
    "not_retried",
    "over_budget",
    "budget_learned",
)
CANCEL_REQUESTED, RESTART_LIMIT, EDITED, WAITING = (
    "cancel_requested",
    "restart_limit",
    "edited",
    "waiting",
)
LEAK, REAPED, REAP_ADVICE = "leak", "reaped", "reap_advice"
MEMORY_RETURNED, MEMORY_CLEARED = "memory_returned", "memory_cleared"
NOTIFY_FAILED, WEBHOOK_FAILED = "notify_failed", "webhook_failed"
NOTES = frozenset(
    {
        OOM,
        NOT_RETRIED,
        OVER_BUDGET,
        BUDGET_LEARNED,
        CANCEL_REQUESTED,
        RESTART_LIMIT,
        EDITED,
        WAITING,
        LEAK,
        REAPED,
        REAP_ADVICE,
        MEMORY_RETURNED,
        MEMORY_CLEARED,
        NOTIFY_FAILED,
        WEBHOOK_FAILED,
    }
)


class Change(NamedTuple):
    """The states an event may find a job in, and the one it leaves it in (None: the
    state it found)."""

    sources: frozenset[str]
    target: str | None


def _c(sources: Iterable[str], target: str | None) -> Change:
    return Change(frozenset(sources), target)


TRANSITIONS: Mapping[str, Change] = MappingProxyType(
    {
        PLACED: _c({QUEUED}, RESERVED),
        LAUNCHED: _c({RESERVED}, RESERVED),  # its supervisor runs; the command not yet
        ADOPTED: _c({RESERVED}, RESERVED),  # a restarted daemon found its supervisor
        STARTED: _c({RESERVED}, RUNNING),
        HELD_BY_USER: _c({QUEUED}, HELD),
        GROUP_HELD: _c({QUEUED}, HELD),  # a job of its group failed
        RELEASED: _c({HELD}, QUEUED),
        ENDED_SUCCEEDED: _c(ACTIVE, SUCCEEDED),
        ENDED_FAILED: _c(ACTIVE, FAILED),
        # Cancelled by its owner while it waits (or before its supervisor ran), or its
        # attempt ended so: a cancel, a preemption without requeue, a launcher gone away.
        ENDED_CANCELLED: _c({QUEUED, HELD, RESERVED, RUNNING}, CANCELLED),
        RETRIED: _c({*ACTIVE, FAILED, CANCELLED, INFEASIBLE}, QUEUED),  # OOM, or `retry`
        REQUEUED: _c(ACTIVE, QUEUED),  # preempted, a launch undone, a reboot
        RESTARTED: _c(ACTIVE, QUEUED),  # a service's restart
        LOST: _c(ACTIVE, FAILED),  # its supervisor died without an exit record
        LAUNCH_FAILED: _c({RESERVED}, FAILED),
        MADE_INFEASIBLE: _c({QUEUED}, INFEASIBLE),
        DEPENDENCY_FAILED: _c({QUEUED}, CANCELLED),
        PREEMPTED: _c(ACTIVE, None),  # asked to stop; it ends (and requeues) later
        HEALTH_FAILED: _c({RUNNING}, None),  # a service's check failed: it is being killed
        KILLED_OVER_LIMIT: _c({RUNNING}, None),  # the watchdog kills it
    }
)
# How a job enters the store: the event that records its submission, and its states.
SUBMITTED_AS = frozenset({QUEUED, HELD, INFEASIBLE})
EVENTS = frozenset({SUBMITTED, *TRANSITIONS, *NOTES})


class IllegalTransition(ValueError):
    """A state change the table does not allow: a bug in the caller, never a race
    (a race is ``Conflict``: the job had moved on)."""


def check(event: str, sources: Iterable[str], target: str | None) -> None:
    """Raise IllegalTransition unless ``event`` may move a job from each of ``sources``
    to ``target`` (None: keep its state)."""
    change = TRANSITIONS.get(event)
    if change is None:
        raise IllegalTransition(
            f"{event!r} is no state change" if event in EVENTS else f"unknown event {event!r}"
        )
    wrong = set(sources) - change.sources
    if wrong:
        raise IllegalTransition(f"{event!r} cannot move a job from {'/'.join(sorted(wrong))}")
    if target != change.target:
        raise IllegalTransition(
            f"{event!r} leaves a job {change.target or 'as it is'}, not {target or 'as it is'}"
        )


def check_note(event: str) -> None:
    """Raise IllegalTransition unless ``event`` is a note (an event that moves no job)."""
    if event not in NOTES:
        raise IllegalTransition(
            f"{event!r} is not a note" if event in EVENTS else f"unknown event {event!r}"
        )
