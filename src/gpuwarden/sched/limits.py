"""Per-user limits: how many GPUs, how much reserved memory and how many jobs one user
may hold at once, so one user cannot take the box. Pure: usage is read from the GPU
states' claims, and a pass books each placement before the next job is checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuwarden.sched.booking import claims
from gpuwarden.sched.model import GpuState, Place, QueuedJob
from gpuwarden.units import format_bytes


@dataclass(frozen=True)
class UserLimits:
    """None: no limit."""

    max_gpus: int | None = None
    max_memory: int | None = None  # bytes reserved, summed over the user's GPUs
    max_running: int | None = None  # reserved or running jobs
    # What a user may ask for at submit (admins are not held to it): the highest
    # --priority and the QoS classes. Defaults: priority <= 0, no guaranteed.
    max_priority: int = 0
    qos: tuple[str, ...] = ("burstable", "besteffort")


@dataclass(frozen=True)
class Limits:
    default: UserLimits = UserLimits()
    users: Mapping[str, UserLimits] = field(default_factory=dict)

    def of(self, user: str) -> UserLimits:
        return self.users.get(user, self.default)

    @property
    def any(self) -> bool:
        return bool(self.users) or self.default != UserLimits()


@dataclass(frozen=True)
class Usage:
    jobs: int = 0
    gpus: int = 0
    memory: int = 0

    def plus(self, gpus: int, memory: int) -> Usage:
        return Usage(self.jobs + 1, self.gpus + gpus, self.memory + memory)


def usage(gpus: Sequence[GpuState]) -> dict[str, Usage]:
    """What each user holds now (reserved and running jobs)."""
    out: dict[str, Usage] = {}
    for uses in claims(gpus).values():
        user = uses[0].user
        out[user] = out.get(user, Usage()).plus(len(uses), sum(u.budget for u in uses))
    return out


def over_limit(
    job: QueuedJob, budget: int | None, held: Mapping[str, Usage], limits: Limits
) -> str | None:
    """Why starting ``job`` (``budget`` bytes on each of its GPUs; None: not known yet,
    memory is then not checked) would take its user past a limit; None when it would
    not."""
    lim = limits.of(job.user)
    now = held.get(job.user, Usage())
    who = f"user {job.user}"
    if lim.max_running is not None and now.jobs + 1 > lim.max_running:
        return f"{who} may run {lim.max_running} job(s) at once and has {now.jobs}"
    if lim.max_gpus is not None and now.gpus + job.count > lim.max_gpus:
        return f"{who} may hold {lim.max_gpus} GPU(s); holds {now.gpus}, this job needs {job.count}"
    if (
        lim.max_memory is not None
        and budget is not None
        and now.memory + budget * job.count > lim.max_memory
    ):
        return (
            f"{who} may reserve {format_bytes(lim.max_memory)}; holds "
            f"{format_bytes(now.memory)}, this job needs {format_bytes(budget * job.count)}"
        )
    return None


def memory_left(user: str, held: Mapping[str, Usage], limits: Limits) -> int | None:
    """Bytes ``user`` may still reserve (never negative); None when they have no limit."""
    cap = limits.of(user).max_memory
    return None if cap is None else max(cap - held.get(user, Usage()).memory, 0)


def grow(held: Mapping[str, Usage], user: str, memory: int) -> dict[str, Usage]:
    """The holdings once a job of ``user``'s already booked reserves ``memory`` more."""
    out = dict(held)
    now = out.get(user, Usage())
    out[user] = replace(now, memory=now.memory + memory)
    return out


def never_within(job: QueuedJob, limits: Limits) -> str | None:
    """Why ``job`` alone is past one of its user's limits, so that it could never start
    however little the user holds (refused at submit); None when it is not."""
    lim = limits.of(job.user)
    who = f"user {job.user}"
    if lim.max_running == 0:
        return f"{who} may run no jobs (max_running = 0)"
    if lim.max_gpus is not None and job.count > lim.max_gpus:
        return f"{who} may hold {lim.max_gpus} GPU(s); this job needs {job.count}"
    if lim.max_memory is not None and job.mem is not None and job.mem * job.count > lim.max_memory:
        return (
            f"{who} may reserve {format_bytes(lim.max_memory)}; this job needs "
            f"{format_bytes(job.mem * job.count)}"
        )
    return None


def not_allowed(user: str, priority: int, qos: str, limits: Limits) -> str | None:
    """Why ``user`` may not ask for this priority or QoS class ([limits] max_priority and
    qos; checked at submit for users who are not admins); None when they may."""
    lim = limits.of(user)
    if priority > lim.max_priority:
        return (
            f"user {user} may ask for priority at most {lim.max_priority} "
            f"([limits] max_priority); asked {priority}"
        )
    if qos not in lim.qos:
        return (
            f"user {user} may ask for qos {', '.join(lim.qos) or '(none)'} "
            f"([limits] qos); asked {qos}"
        )
    return None


def book(held: Mapping[str, Usage], job: QueuedJob, place: Place) -> dict[str, Usage]:
    out = dict(held)
    out[job.user] = out.get(job.user, Usage()).plus(len(place.gpus), place.budget * len(place.gpus))
    return out
