"""A job as the API answers it: the model's fields with what the daemon and its policies
say of them (the enforcement that applies, the verdict on its declared memory). Its
shape is ``client/views.py``'s ``JobDoc``, which mypy checks this against."""

from __future__ import annotations

from typing import Any, cast

from gpuwarden.client.views import EnforcementDoc, JobDoc
from gpuwarden.daemon.mps_jobs import SHARED_FATE
from gpuwarden.daemon.rows import option_values
from gpuwarden.jobs.model import SUCCEEDED, Job, iso
from gpuwarden.sched.history import declared_vs_actual
from gpuwarden.sched.watchdog import policy


def job_json(job: Job, *, with_env: bool = False) -> JobDoc:
    """A job as the API answers it (``show --json``, ``ps --json``, the web page, the
    notifications): ``env`` only for those who may see it."""
    s = job.spec
    out: JobDoc = {
        "id": job.id,
        "user": s.user,
        "uid": s.uid,
        "name": s.name,
        "group": s.group,
        "key": s.key,
        "state": job.state,
        "command": list(s.command),
        "cwd": s.cwd,
        "gpus": list(job.gpus),
        "gpu_uuids": list(job.gpu_uuids),
        "gpu_count": s.gpus,
        "gpu_ids": None if s.gpu_ids is None else list(s.gpu_ids),
        "mem": s.mem,
        "budget": job.budget,
        "context": job.context,
        "peak_memory": job.peak_memory,
        "exclusive": s.exclusive,
        "priority": s.priority,
        "qos": s.qos,
        "mem_limit": s.mem_limit,
        "request": job.request,
        "grace": s.grace,
        "retries": s.retries,
        "no_requeue": s.no_requeue,
        "requeue_on_reboot": s.requeue_on_reboot,
        "checkpoint": s.checkpoint,
        "mps": s.mps,
        "mem_auto": s.mem_auto,
        "cpus": s.cpus,
        "no_numa": s.no_numa,
        "mig": s.mig,
        "attach": s.attach,
        "service": None if s.service is None else s.service.to_json(),
        "notify": s.notify,
        "array": None
        if s.array is None
        else {
            "id": s.array.array_id,
            "index": s.array.index,
            "limit": s.array.limit,
            "task": s.array.ref(),
        },
        "restarts": job.restarts,
        "health_failures": job.health_failures,
        "cpu_set": list(job.cpu_set),
        "allocated_peak": job.allocated_peak,
        # Advice for jobs that ended normally: a failure (an OOM most of all) may
        # stop before its peak, or be stopped by its limit.
        "declared_vs_peak": None
        if job.state != SUCCEEDED
        else declared_vs_actual(s.mem, job.allocations_peak),
        "oom_end": job.oom_end(),
        "sm_percent": s.sm_percent,
        "after": list(s.after),
        "after_any": list(s.after_any),
        "after_fail": list(s.after_fail),
        "timeout": s.timeout,
        "exit_code": job.exit_code,
        "submitted_at": iso(job.submitted_at),
        "started_at": iso(job.started_at),
        "ended_at": iso(job.ended_at),
        "reason": job.reason,
        "attempts": job.attempts,
        "preemptions": job.preemptions,
        "oom_retries": job.oom_retries,
        # How an OOM retry was sized; a final OOM that was not retried says it in
        # oom_end (its fields hold what that OOM asked for).
        "oom": None
        if not job.oom_retries or (job.oom_tried is None and job.oom_need is None)
        else {
            "tried": job.oom_tried,
            "need": job.oom_need,
            "retry_budget": job.retry_mem,
            "retry_ceiling": job.retry_ceiling,
        },
        "preempting": job.preempting_at is not None,
        "enforcement": enforcement(job),
        "memory_release": None if job.release is None else job.release.to_json(),
        "not_before": iso(job.not_before),
        "events": [e.to_json() for e in job.events],
    }
    # The fields of the options document (jobs/request.OPTIONS) by name, with no line
    # here of their own: JobDoc names those a client reads.
    cast(dict[str, Any], out).update(option_values(s, defaults=True))
    if with_env:
        out["env"] = dict(s.env)
    return out


def enforcement(job: Job) -> EnforcementDoc:
    """Which layers of memory enforcement apply to this job (``show``)."""
    limit = job.cap()
    return {
        "limit": limit,
        "cooperative": None
        if limit is None
        else "PyTorch memory fraction at the limit (the CUDA context booked beside it) "
        "+ expandable segments",
        "hard": None
        if limit is None or not job.spec.mps
        else "MPS pinned device memory limit"
        + (f", {job.spec.sm_percent}% of SMs" if job.spec.sm_percent else "")
        + f" ({SHARED_FATE})",
        "watchdog": None if limit is None else policy(job.spec.qos),
    }
