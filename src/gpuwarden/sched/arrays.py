"""An array's ``%N``: at most N of its tasks hold GPUs at once, decided per pass from the
jobs waiting and those holding GPUs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwarden.jobs.model import Job


def throttle(ready: Sequence[Job], active: Iterable[Job]) -> tuple[list[Job], dict[int, str]]:
    """Of the jobs ready to be placed (in queue order), those their arrays' %N lets start
    this pass, and why each other one waits: an array's tasks that hold GPUs, and those
    this pass may place, never exceed its limit."""
    holding: dict[int, int] = {}
    for job in active:
        if job.spec.array is not None:
            holding[job.spec.array.array_id] = holding.get(job.spec.array.array_id, 0) + 1
    allowed: list[Job] = []
    waiting: dict[int, str] = {}
    for job in ready:
        member = job.spec.array
        if member is None or member.limit is None:
            allowed.append(job)
            continue
        n = holding.get(member.array_id, 0)
        if n >= member.limit:
            waiting[job.id] = (
                f"array {member.array_id}: {n} of at most {member.limit} tasks running"
            )
            continue
        holding[member.array_id] = n + 1
        allowed.append(job)
    return allowed, waiting
