"""``gpuwarden report``: what the ended jobs of a period used, per user (or group, or
key), as ``sacct`` and jobstats tell Slurm users (pure: jobs in, figures out); and the
users' fair-share usage the queue is ordered by (``FairUsage``)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpuwarden.jobs.model import Job
from gpuwarden.units import GiB

if TYPE_CHECKING:
    from gpuwarden.daemon.store import Store

BY = ("user", "group", "key")
NONE_LABEL = "-"  # the row of jobs without a group (or key)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p`` percentile (0-100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(math.ceil(p / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def run_seconds(job: Job) -> float:
    """How long its last attempt ran: start to end (0 when it never started)."""
    if job.started_at is None or job.ended_at is None:
        return 0.0
    return max(job.ended_at - job.started_at, 0.0)


def queue_wait(job: Job) -> float | None:
    """Submission to its first placement; None when it was never placed."""
    placed = next((e.at for e in job.events if e.kind == "placed"), None)
    return None if placed is None else max(placed - job.submitted_at, 0.0)


def _label(job: Job, by: str) -> str:
    value = {"user": job.spec.user, "group": job.spec.group, "key": job.spec.key}[by]
    return value if value is not None else NONE_LABEL


def usage_row(job: Job) -> dict[str, float | int]:
    """One ended job's figures over all its attempts (a requeue, an OOM retry or a
    restart each ran on GPUs too): GPU-hours (run time x its GPUs), memory reserved (its
    budget per GPU x its GPUs x run time) and used (its peak per GPU likewise) in GiB-h,
    its OOMs and its preemptions."""
    hours = run_seconds(job) / 3600
    count = len(job.gpus) or job.spec.gpus
    ran = hours > 0
    before = job.earlier
    return {
        "gpu_hours": (hours * count if ran else 0.0) + before.gpu_seconds / 3600,
        "reserved_gib_hours": (job.budget or 0) / GiB * count * hours
        + before.reserved / GiB / 3600,
        "used_gib_hours": (job.peak_memory or 0) / GiB * count * hours + before.used / GiB / 3600,
        "ooms": sum(1 for e in job.events if e.kind == "oom"),
        "preemptions": job.preemptions,
    }


def report(jobs: Iterable[Job], by: str = "user") -> list[dict[str, Any]]:
    """One row per user (``by``: group, key) over ``jobs`` (the ended ones of the period),
    sorted by name: jobs by their end, GPU-hours, GiB-h reserved and used, OOMs,
    preemptions and the queue wait's p50/p95 in seconds."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}")
    rows: dict[str, dict[str, Any]] = {}
    waits: dict[str, list[float]] = {}
    for job in jobs:
        label = _label(job, by)
        row = rows.setdefault(
            label,
            {
                by: label,
                "jobs": 0,
                "succeeded": 0,
                "failed": 0,
                "cancelled": 0,
                "infeasible": 0,
                "gpu_hours": 0.0,
                "reserved_gib_hours": 0.0,
                "used_gib_hours": 0.0,
                "ooms": 0,
                "preemptions": 0,
            },
        )
        row["jobs"] += 1
        row[job.state] += 1
        for k, v in usage_row(job).items():
            row[k] += v
        wait = queue_wait(job)
        if wait is not None:
            waits.setdefault(label, []).append(wait)
    out = []
    for label in sorted(rows):
        row = rows[label]
        for k in ("gpu_hours", "reserved_gib_hours", "used_gib_hours"):
            row[k] = round(row[k], 6)
        w = waits.get(label, [])
        row["wait_p50"] = percentile(w, 50)
        row["wait_p95"] = percentile(w, 95)
        out.append(row)
    return out


COLUMNS = (
    "jobs",
    "succeeded",
    "failed",
    "cancelled",
    "infeasible",
    "gpu_hours",
    "reserved_gib_hours",
    "used_gib_hours",
    "ooms",
    "preemptions",
    "wait_p50",
    "wait_p95",
)


class FairUsage:
    """Each user's decayed usage (sched/fairshare.py) from the store, read again at most
    every ``FAIR_REFRESH`` seconds: the pass orders by it and ``ps``/``show`` show it, and
    it changes slowly. Empty when fair share is off."""

    FAIR_REFRESH = 1.0

    def __init__(self, store: Store, halflife: float, clock: Callable[[], float]) -> None:
        self.store, self.halflife, self.clock = store, halflife, clock
        self._at: float | None = None
        self._usage: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self) -> dict[str, float]:
        if self.halflife <= 0:
            return {}
        from gpuwarden.sched.fairshare import horizon, usage

        now = self.clock()
        with self._lock:
            if self._at is None or not 0 <= now - self._at < self.FAIR_REFRESH:
                spans = self.store.usage_spans(now - horizon(self.halflife))
                self._usage, self._at = usage(spans, now, self.halflife), now
            return self._usage
