"""A job as the scheduler sees it: its entry in the queue policy's input
(``QueuedJob``) and the run time backfill plans with, learned from its user's earlier
runs. The loop's passes and ``show`` both read them, so what ``show`` says of a job's
expected run time is what the scheduler used."""

from __future__ import annotations

from gpuwarden.client.views import EstimateDoc
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import Job
from gpuwarden.sched.model import QueuedJob


def queued_view(job: Job, estimate: float | None = None, now: float = 0.0) -> QueuedJob:
    """The job as the queue policy sees it at ``now``; ``estimate`` is its learned run
    time (``learned_runtime``), its ``--timeout`` the bound."""
    s = job.spec
    return QueuedJob(
        id=job.id,
        user=s.user,
        mem=job.request,
        mem_ceiling=job.retry_ceiling,
        wait_for_ceiling=now < (job.ceiling_until or 0.0),
        count=s.gpus,
        gpu_ids=s.gpu_ids,
        exclusive=s.exclusive,
        priority=s.priority,
        submitted_at=job.submitted_at,
        qos=s.qos,
        runtime=s.timeout,
        estimate=estimate,
        not_before=job.not_before or 0.0,
        cpus=s.cpus,
        mig=s.mig,
        mps=s.mps,
        returning=job.returning,
        service=s.service is not None,
    )


def learned_runtime(store: Store, job: Job) -> tuple[float | None, str | None]:
    """The run time of the job's key (else name) learned from its user's earlier
    successful runs, and how it was found (None: nothing to learn from)."""
    from gpuwarden.sched.history import learned_runtime as learn

    s = job.spec
    return learn(store.runtimes(s.uid, key=s.key, name=s.name))


def estimate_view(job: Job, learned: float | None, how: str | None) -> EstimateDoc:
    """What backfill expects of the job's run time, for ``show``: the seconds it plans
    with and where they come from."""
    from gpuwarden.units import format_duration

    seconds = queued_view(job, learned).expected_runtime
    timeout = job.spec.timeout
    if seconds is None:
        why = (
            "unknown: no --timeout and no earlier successful run of its key or name; "
            "backfill counts it as running until it ends"
        )
    elif learned is not None and (timeout is None or learned <= timeout):
        why = f"learned: {how}" + (
            "" if timeout is None else f" (--timeout {format_duration(timeout)} bounds it)"
        )
    else:
        why = f"its --timeout, {format_duration(seconds)}"
    return {"seconds": seconds, "learned": learned, "how": why}
