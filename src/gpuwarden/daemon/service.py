"""What the API can ask of the daemon, with validation and authorization. The HTTP layer
(api.py) only translates; every rule about who may do what lives here or is asked of
``JobService`` (``is_admin``, ``may``, ``owned``). It reads jobs and takes an attached
job's reports, and holds the rest: taking jobs in (submit, edit: daemon/admission.py,
which checks a request's fields with daemon/submission.py), the job actions (cancel,
hold, release, retry, ...: daemon/jobactions.py) and the GPU drains (daemon/drains.py);
it reads logs with daemon/joblogs.py."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.client.views import JobDoc
from gpuwarden.daemon.admission import JobAdmission
from gpuwarden.daemon.auth import Caller, admin_gids, may_manage
from gpuwarden.daemon.config import Config
from gpuwarden.daemon.drains import GpuDrains
from gpuwarden.daemon.jobactions import JobActions
from gpuwarden.daemon.jobjson import job_json
from gpuwarden.daemon.joblogs import LogChunk, read_log
from gpuwarden.daemon.queueview import estimate_view, learned_runtime
from gpuwarden.daemon.store import Store
from gpuwarden.errors import PermissionDenied, UsageError
from gpuwarden.jobs import model
from gpuwarden.jobs.model import Job
from gpuwarden.sched.model import GpuState


class JobService:
    """Operations on jobs for one caller. ``wake`` nudges the scheduler loop; ``gpus``
    returns the GPU states of the last scheduling pass (for at-once infeasibility)."""

    def __init__(
        self,
        store: Store,
        jobs_dir: Path,
        config: Config,
        *,
        wake: Callable[[], None],
        gpus: Callable[[], Sequence[GpuState]],
        cancel_running: Callable[[Job, bool], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.jobs_dir = jobs_dir
        self.config = config
        self.wake = wake
        self.gpus = gpus
        self.clock = clock
        self.admins = admin_gids(config.admin_groups)
        self.daemon_uid = os.geteuid()
        from gpuwarden.daemon.accounting import FairUsage

        self.fair_usage = FairUsage(store, config.policy.fairshare_halflife, clock)
        self.drains = GpuDrains(store, self.is_admin, gpus, wake, clock)
        self.admission = JobAdmission(
            store,
            jobs_dir,
            config,
            gpus,
            is_admin=self.is_admin,
            owned=self.owned,
            view=self.view,
            wake=wake,
            clock=clock,
        )
        self.actions = JobActions(
            store,
            jobs_dir,
            owned=self.owned,
            may=self.may,
            is_admin=self.is_admin,
            view=self.view,
            wake=wake,
            cancel_running=cancel_running,
            clock=clock,
        )

    def is_admin(self, caller: Caller) -> bool:
        """Root, a member of an admin group or (of a user's own daemon) its user: may act
        on every job, and drain GPUs."""
        return may_manage(caller, -1, self.admins, self.daemon_uid)

    def may(self, caller: Caller, job: Job) -> bool:
        """Whether the caller may act on the job: its owner, or an admin."""
        return may_manage(caller, job.spec.uid, self.admins, self.daemon_uid)

    def owned(self, caller: Caller, job_id: int, verb: str) -> Job:
        """The job, where the caller may act on it (``may``); else ``PermissionDenied``
        saying who may ``verb`` it."""
        job = self.store.get(job_id)
        if not self.may(caller, job):
            raise PermissionDenied(
                f"job {job_id} belongs to {job.user}; only its owner or an admin may {verb} it"
            )
        return job

    def view(self, caller: Caller, job: Job) -> JobDoc:
        """The job's JSON for this caller: its environment only to its owner or an admin;
        a waiting job's fair share where that is on (``fair_share``: its user's decayed
        usage in byte-seconds, and the half-life)."""
        out = job_json(job, with_env=self.may(caller, job))
        halflife = self.config.policy.fairshare_halflife
        if halflife > 0 and job.state in (model.QUEUED, model.HELD):
            out["fair_share"] = {
                "usage": self.fair_usage.get().get(job.spec.user, 0.0),
                "halflife": halflife,
            }
        return out

    # -- an attached job's launcher reports -----------------------------------------
    def _attached(self, caller: Caller, job_id: int) -> tuple[Job, Path]:
        from gpuwarden.daemon.attached import check_reporter
        from gpuwarden.jobs.jobdir import job_dir

        job = self.owned(caller, job_id, "report on")
        if job.spec.attach is None:
            raise UsageError(f"job {job_id} is started by the daemon, not attached")
        d = job_dir(self.jobs_dir, job)
        check_reporter(d, job.id, caller)
        return job, d

    def started(self, caller: Caller, job_id: int, body: Any) -> JobDoc:
        """The launcher of an attached job started its command (after the placement)."""
        from gpuwarden.daemon.attached import record_start

        job, d = self._attached(caller, job_id)
        if job.state != model.RESERVED:
            raise UsageError(
                f"job {job_id} is {job.state}; a start is reported once, after the daemon placed it"
            )
        record_start(d, job.id, caller.pid, body)
        self.wake()
        return self.view(caller, self.store.get(job.id))

    def ended(self, caller: Caller, job_id: int, body: Any) -> JobDoc:
        """The launcher of an attached job reports how it ended; the loop settles it."""
        from gpuwarden.daemon.attached import record_end

        job, d = self._attached(caller, job_id)
        if job.state not in model.ACTIVE:
            raise UsageError(
                f"job {job_id} is {job.state}; only a placed job's end is "
                "reported (cancel a waiting one)"
            )
        record_end(d, job.id, body)
        self.wake()
        return self.view(caller, self.store.get(job.id))

    # -- read -----------------------------------------------------------------------
    def show(self, caller: Caller, job_id: int) -> JobDoc:
        job = self.store.get(job_id)
        out = self.view(caller, job)
        if not job.terminal:
            out["estimate"] = estimate_view(job, *learned_runtime(self.store, job))
        return out

    def list(
        self,
        caller: Caller,
        *,
        all_jobs: bool,
        user: str | None,
        group: str | None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
        before: int | None = None,
        after: int | None = None,
        array: int | None = None,
    ) -> list[JobDoc]:
        """``states`` (``ps --state``) names the states shown, ended ones too; without
        it, the waiting and running jobs (with ``all_jobs``, every job). One page of
        at most ``limit``: the first above ``after``, else the latest below ``before``
        (or the latest of all); in id order either way. ``array``: its tasks alone."""
        if states is not None:
            unknown = [s for s in states if s not in model.STATES]
            if unknown:
                raise UsageError(
                    f"unknown state {unknown[0]!r} (states: {', '.join(model.STATES)})"
                )
        elif not all_jobs:
            states = [s for s in model.STATES if s not in model.TERMINAL]
        jobs = self.store.list(
            states=states,
            user=user,
            group=group,
            limit=limit,
            before=before,
            after=after,
            array=array,
            newest=limit is not None and after is None,
        )
        return [self.view(caller, j) for j in sorted(jobs, key=lambda j: j.id)]

    def report(self, caller: Caller, since: float | None, by: str) -> dict[str, Any]:
        """Accounting (``gpuwarden report``): the jobs that ended in the last ``since``
        seconds (None: all kept), summed per user, group or key. Any local user may read
        it, as ``ps`` shows every user's jobs; read-only."""
        from gpuwarden.daemon.accounting import BY, report

        if by not in BY:
            raise UsageError(f"by must be one of {', '.join(BY)}")
        now = self.clock()
        cutoff = None if since is None else now - since
        jobs = [
            j
            for j in self.store.list(states=sorted(model.TERMINAL), with_env=False)
            if cutoff is None or (j.ended_at is not None and j.ended_at >= cutoff)
        ]
        return {
            "by": by,
            "since": model.iso(cutoff),
            "until": model.iso(now),
            "rows": report(jobs, by),
        }

    def job_pids(self, caller: Caller) -> dict[str, Any]:
        """pid -> job id for every process of every running job, to any local user (``ps``
        shows them every job already): ``status`` names the job of other users' processes,
        whose environment it cannot read. One walk of /proc; read-only."""
        import psutil

        from gpuwarden.procs.identity import identify

        children: dict[int, list[int]] = {}
        for p in psutil.process_iter(["ppid"]):
            ppid = p.info.get("ppid")
            if isinstance(ppid, int):
                children.setdefault(ppid, []).append(p.pid)
        pids: dict[str, int] = {}
        for job in self.store.active():
            if (
                job.supervisor_pid is None
                or job.supervisor_start is None
                or identify(job.supervisor_pid, job.supervisor_start) is None
            ):
                continue
            todo = [job.supervisor_pid]
            while todo:
                pid = todo.pop()
                if str(pid) not in pids:
                    pids[str(pid)] = job.id
                    todo.extend(children.get(pid, ()))
        return {"pids": pids}

    def logs(
        self, caller: Caller, job_id: int, stream: str, offset: int, attempt: int | None = None
    ) -> LogChunk:
        """A chunk of one attempt's output (the latest unless ``attempt``, counted from 1),
        for ``logs`` and ``logs -f`` polling; the owner's or an admin's alone."""
        job = self.owned(caller, job_id, "read the logs of")
        return read_log(self.jobs_dir, job, stream, offset, attempt)
