"""What the API can ask of the daemon, with validation and authorization. The HTTP layer
(api.py) only translates; every rule about who may do what lives here or is asked of
``JobService`` (``is_admin``, ``may``, ``owned``). It takes jobs in (submit, edit, an
attached job's reports) and reads them, and holds the job actions (cancel, hold,
release, retry, ...: daemon/jobactions.py) and the GPU drains (daemon/drains.py); it
checks a request's fields with daemon/submission.py and reads logs with
daemon/joblogs.py."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.client.views import JobDoc
from gpuwarden.daemon.auth import Caller, admin_gids, may_manage
from gpuwarden.daemon.config import Config
from gpuwarden.daemon.drains import GpuDrains
from gpuwarden.daemon.jobactions import JobActions
from gpuwarden.daemon.jobjson import job_json
from gpuwarden.daemon.joblogs import LogChunk, read_log
from gpuwarden.daemon.queueview import estimate_view, learned_runtime
from gpuwarden.daemon.store import Store
from gpuwarden.daemon.submission import spec_from_request
from gpuwarden.errors import PermissionDenied, UsageError
from gpuwarden.jobs import model
from gpuwarden.jobs.model import Job, JobSpec
from gpuwarden.jobs.request import EDITABLE, GUARANTEED
from gpuwarden.sched.model import GpuState, QueuedJob


class JobService:
    """Operations on jobs for one caller. ``wake`` nudges the scheduler loop; ``gpus``
    returns the GPU states of the last scheduling pass (for at-once infeasibility)."""

    def __init__(self, store: Store, jobs_dir: Path, config: Config, *,
                 wake: Callable[[], None], gpus: Callable[[], Sequence[GpuState]],
                 cancel_running: Callable[[Job, bool], None],
                 clock: Callable[[], float] = time.time) -> None:
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
        self.actions = JobActions(store, jobs_dir, owned=self.owned, may=self.may,
                                  is_admin=self.is_admin, view=self.view, wake=wake,
                                  cancel_running=cancel_running, clock=clock)

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
            raise PermissionDenied(f"job {job_id} belongs to {job.user}; only its owner or an "
                                   f"admin may {verb} it")
        return job

    def view(self, caller: Caller, job: Job) -> JobDoc:
        """The job's JSON for this caller: its environment only to its owner or an admin;
        a waiting job's fair share where that is on (``fair_share``: its user's decayed
        usage in byte-seconds, and the half-life)."""
        out = job_json(job, with_env=self.may(caller, job))
        halflife = self.config.policy.fairshare_halflife
        if halflife > 0 and job.state in (model.QUEUED, model.HELD):
            out["fair_share"] = {"usage": self.fair_usage.get().get(job.spec.user, 0.0),
                                 "halflife": halflife}
        return out

    # -- submit and read ------------------------------------------------------------
    def submit(self, caller: Caller, body: Mapping[str, Any]) -> dict[str, Any]:
        from gpuwarden.jobs.arrays import parse_array

        gpus = list(self.gpus())
        spec, dropped = self._validate(body, caller, gpus)
        array = None if body.get("array") is None else parse_array(body["array"])
        if array is not None and spec.attach is not None:
            raise UsageError("a job another launcher starts (attach) cannot be an array")
        spec = self._every_task(spec)
        self._allowed(caller, spec)
        learned = None
        if spec.mem_auto:
            from gpuwarden.sched.history import learned_budget

            mem, learned = learned_budget(self.store.peaks(spec.uid, key=spec.key,
                                                           name=spec.name))
            if mem is None and spec.mps:
                raise UsageError("mps needs mem, and there is no earlier run to learn it "
                                 "from: give --mem SIZE this time")
            spec = dataclasses.replace(spec, mem=mem, mem_limit=None if mem is None else
                                       spec.mem_limit and max(spec.mem_limit, mem))
        never = self._never(spec, gpus)
        if never is not None:  # as select does: exit 2, and nothing queued to wait for ever
            raise UsageError(f"this job can never run here: {never}")
        held = self.group_held(spec)
        job, created = self.store.submit(spec, self.clock(),
                                         state=model.QUEUED if held is None else model.HELD,
                                         reason=held, array=array)
        if created and learned is not None:
            self.store.add_event(job.id, "budget_learned", f"mem auto: {learned}", self.clock())
            job = self.store.get(job.id)
        if created and spec.attach is not None:
            self._claim(caller, job)
        if created:
            self.wake()
        return {**self.view(caller, job), "created": created, "dropped_env": dropped,
                "group_held": held if created else None,
                "tasks": None if array is None else len(array.indices)}

    def _every_task(self, spec: JobSpec) -> JobSpec:
        """Dependencies on an array's id wait for each of its tasks (jobs/arrays.py);
        ids that name no job stay, for the store to refuse."""
        def every(ids: tuple[int, ...]) -> tuple[int, ...]:
            if not ids:
                return ids
            found, missing = self.store.resolve(list(ids))
            return tuple(sorted({*found, *(m for m in missing if isinstance(m, int))}))

        return dataclasses.replace(spec, after=every(spec.after),
                                   after_any=every(spec.after_any),
                                   after_fail=every(spec.after_fail))

    def _validate(self, body: Mapping[str, Any], caller: Caller,
                  gpus: Sequence[GpuState]) -> tuple[JobSpec, list[str]]:
        """``spec_from_request`` with this daemon's GPUs and settings: the one check of
        a request's fields, for submit and edit."""
        from gpuwarden.sched.placement import capacity

        return spec_from_request(body, caller, len(gpus) or 1 << 16,
                                 capacities={g.index: capacity(g) for g in gpus},
                                 oom_retries=self.config.oom_retries,
                                 max_grace=self.config.max_grace)

    def _allowed(self, caller: Caller, spec: JobSpec) -> None:
        """Refuse what the caller may not ask for: [limits] max_priority and qos for
        users who are not admins (submit and edit)."""
        if spec.uid == 0 and caller.uid != 0:  # impossible by construction; kept as a guard
            raise PermissionDenied("only root may run jobs as root")
        if not self.is_admin(caller):  # admins: any
            from gpuwarden.sched.limits import not_allowed

            why = not_allowed(spec.user, spec.priority, spec.qos, self.config.policy.limits)
            if why is not None:  # one could preempt other users' jobs at will
                raise PermissionDenied(why)

    def edit(self, caller: Caller, job_id: int, body: Any) -> JobDoc:
        """Change a queued or held job's request (owner or admin): the fields of
        EDITABLE, checked as at submit (the same bounds, [limits] and "can never run
        here"), the others kept. Its place in the queue (submission time) is kept."""
        job = self.owned(caller, job_id, "edit")
        if not isinstance(body, Mapping) or not body:
            raise UsageError("name what to change: " + ", ".join(EDITABLE))
        unknown = sorted(set(body) - set(EDITABLE))
        if unknown:
            raise UsageError(f"cannot edit {', '.join(unknown)} (editable: "
                             f"{', '.join(EDITABLE)})")
        if job.state not in (model.QUEUED, model.HELD):
            raise UsageError(f"job {job_id} is {job.state}; only a queued or held job can "
                             "be edited")
        if body.get("mem") == "auto":
            raise UsageError("mem: give a size (auto is learned at submit)")
        s = job.spec
        was: dict[str, Any] = {"mem": s.mem, "mem_limit": s.mem_limit, "priority": s.priority,
                               "qos": s.qos, "gpus": s.gpus, "timeout": s.timeout,
                               "name": s.name}
        # The fields that submit checks together with the editable ones.
        request: dict[str, Any] = {
            "command": list(s.command), "gpu_ids": None if s.gpu_ids is None else
            list(s.gpu_ids), "exclusive": s.exclusive, "mps": s.mps,
            "sm_percent": s.sm_percent, "cpus": s.cpus, "no_numa": s.no_numa,
            "mig": s.mig, "key": s.key, "retries": s.retries,
            **{k: v for k, v in was.items() if v is not None}, **body}
        if "mem" in body and body["mem"] is not None and "mem_limit" not in body \
                and s.mem_limit is not None and s.qos != GUARANTEED:
            request.pop("mem_limit")  # a new budget: its old burst limit may be below it
        gpus = list(self.gpus())
        checked, _ = self._validate(request, caller, gpus)
        changes = {k: getattr(checked, k) for k in EDITABLE if getattr(checked, k) != was[k]}
        spec = dataclasses.replace(s, **changes)
        self._allowed(caller, spec)
        never = self._never(spec, gpus)
        if never is not None:
            raise UsageError(f"this job can never run here: {never}")
        if not changes:
            return self.view(caller, job)
        from gpuwarden.units import format_bytes

        def said(k: str, v: Any) -> str:
            return format_bytes(v) if k in ("mem", "mem_limit") and v is not None else str(v)

        detail = ", ".join(f"{k} {said(k, was[k])} -> {said(k, v)}" for k, v in changes.items())
        job = self.store.edit(job.id, (model.QUEUED, model.HELD), changes, now=self.clock(),
                              detail=f"by {caller.user}: {detail}")
        self.wake()
        return self.view(caller, job)

    def group_held(self, spec: JobSpec) -> str | None:
        """Why a new job of this user's group is held at submit: the group's last jobs all
        failed the same way (as the loop holds the queued ones) and none was released
        since; None when it may queue. An attached job is already running: never held."""
        from gpuwarden.sched.history import STREAK, failing_streak, failure_signature

        if spec.group is None or spec.attach is not None:
            return None
        recent = self.store.recent_ends(spec.uid, spec.group, STREAK)
        same = failing_streak([failure_signature(j.state, j.exit_code, j.reason,
                                                 any(e.kind == "oom" for e in j.events))
                               for j in recent])
        if same is None:
            return None
        if self.store.group_released_since(spec.uid, spec.group,
                                           max(j.ended_at or 0.0 for j in recent)):
            return None
        return (f"group {spec.group}: its last {STREAK} jobs failed the same way ({same}); "
                "held until released")

    def _never(self, spec: JobSpec, gpus: Sequence[GpuState]) -> str | None:
        """Why a job could never run on these GPUs (over every GPU's capacity, more GPUs
        than there are, ...) or for its user (alone over a [limits] value); None when it
        could. Without GPU states yet, the scheduling pass decides (``infeasible``)."""
        from gpuwarden.sched.limits import never_within
        from gpuwarden.sched.placement import infeasible_reason

        if not gpus:
            return None
        job = QueuedJob(id=0, user=spec.user, mem=spec.mem, count=spec.gpus,
                        gpu_ids=spec.gpu_ids, exclusive=spec.exclusive,
                        priority=spec.priority, qos=spec.qos, runtime=spec.timeout,
                        cpus=spec.cpus, mig=spec.mig, mps=spec.mps)
        return infeasible_reason(job, gpus) or never_within(job, self.config.policy.limits)

    def _claim(self, caller: Caller, job: Job) -> None:
        """The attaching process stands in for the job's supervisor (daemon/attached.py).
        Should that fail, the job is cancelled here rather than left without one."""
        from gpuwarden.daemon.attached import claim
        from gpuwarden.jobs.jobdir import job_dir

        try:
            claim(job_dir(self.jobs_dir, job), job.id, caller)
        except (OSError, UsageError) as e:
            now = self.clock()
            self.store.transition(job.id, (model.QUEUED,), model.CANCELLED, now=now,
                                  kind="cancelled", detail=f"cannot attach: {e}",
                                  reason=f"cannot attach: {e}", ended_at=now)
            raise UsageError(f"cannot attach job {job.id}: {e}") from None

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
            raise UsageError(f"job {job_id} is {job.state}; a start is reported once, after "
                             "the daemon placed it")
        record_start(d, job.id, caller.pid, body)
        self.wake()
        return self.view(caller, self.store.get(job.id))

    def ended(self, caller: Caller, job_id: int, body: Any) -> JobDoc:
        """The launcher of an attached job reports how it ended; the loop settles it."""
        from gpuwarden.daemon.attached import record_end

        job, d = self._attached(caller, job_id)
        if job.state not in model.ACTIVE:
            raise UsageError(f"job {job_id} is {job.state}; only a placed job's end is "
                             "reported (cancel a waiting one)")
        record_end(d, job.id, body)
        self.wake()
        return self.view(caller, self.store.get(job.id))

    def show(self, caller: Caller, job_id: int) -> JobDoc:
        job = self.store.get(job_id)
        out = self.view(caller, job)
        if not job.terminal:
            out["estimate"] = estimate_view(job, *learned_runtime(self.store, job))
        return out

    def list(self, caller: Caller, *, all_jobs: bool, user: str | None,
             group: str | None, states: Sequence[str] | None = None,
             limit: int | None = None, before: int | None = None,
             after: int | None = None, array: int | None = None) -> list[JobDoc]:
        """``states`` (``ps --state``) names the states shown, ended ones too; without
        it, the waiting and running jobs (with ``all_jobs``, every job). One page of
        at most ``limit``: the first above ``after``, else the latest below ``before``
        (or the latest of all); in id order either way. ``array``: its tasks alone."""
        if states is not None:
            unknown = [s for s in states if s not in model.STATES]
            if unknown:
                raise UsageError(f"unknown state {unknown[0]!r} (states: "
                                 f"{', '.join(model.STATES)})")
        elif not all_jobs:
            states = [s for s in model.STATES if s not in model.TERMINAL]
        jobs = self.store.list(states=states, user=user, group=group, limit=limit,
                               before=before, after=after, array=array,
                               newest=limit is not None and after is None)
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
        jobs = [j for j in self.store.list(states=sorted(model.TERMINAL), with_env=False)
                if cutoff is None or (j.ended_at is not None and j.ended_at >= cutoff)]
        return {"by": by, "since": model.iso(cutoff), "until": model.iso(now),
                "rows": report(jobs, by)}

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
            if job.supervisor_pid is None or job.supervisor_start is None or \
                    identify(job.supervisor_pid, job.supervisor_start) is None:
                continue
            todo = [job.supervisor_pid]
            while todo:
                pid = todo.pop()
                if str(pid) not in pids:
                    pids[str(pid)] = job.id
                    todo.extend(children.get(pid, ()))
        return {"pids": pids}

    def logs(self, caller: Caller, job_id: int, stream: str, offset: int,
             attempt: int | None = None) -> LogChunk:
        """A chunk of one attempt's output (the latest unless ``attempt``, counted from 1),
        for ``logs`` and ``logs -f`` polling; the owner's or an admin's alone."""
        job = self.owned(caller, job_id, "read the logs of")
        return read_log(self.jobs_dir, job, stream, offset, attempt)
