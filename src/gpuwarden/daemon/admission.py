"""Taking a job in: submit and edit check a request alike, against this daemon and not
the request alone: its fields (daemon/submission.py), what the caller may ask for
([limits] for users who are not admins), whether it could ever run on these GPUs or for
its user, an array's tasks as dependencies, a budget learned from earlier runs and a
failing group's hold; then the store writes it. JobService (daemon/service.py) holds
this beside the job actions (daemon/jobactions.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.client.views import JobDoc
from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.config import Config
from gpuwarden.daemon.store import Store
from gpuwarden.daemon.submission import spec_from_request
from gpuwarden.errors import PermissionDenied, UsageError
from gpuwarden.jobs import model
from gpuwarden.jobs.model import Job, JobSpec
from gpuwarden.jobs.request import EDITABLE, GUARANTEED
from gpuwarden.sched.model import GpuState, QueuedJob


@dataclass(frozen=True)
class JobAdmission:
    """Submit and edit for one caller. ``gpus`` returns the GPU states of the last
    scheduling pass (for at-once infeasibility); ``is_admin`` is the daemon's admin
    check and ``owned`` reads a job the caller may act on (else ``PermissionDenied``);
    ``view`` is the job's JSON for the caller; ``wake`` nudges the scheduler loop."""

    store: Store
    jobs_dir: Path
    config: Config
    gpus: Callable[[], Sequence[GpuState]]
    is_admin: Callable[[Caller], bool]
    owned: Callable[[Caller, int, str], Job]
    view: Callable[[Caller, Job], JobDoc]
    wake: Callable[[], None]
    clock: Callable[[], float] = time.time

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

            mem, learned = learned_budget(self.store.peaks(spec.uid, key=spec.key, name=spec.name))
            if mem is None and spec.mps:
                raise UsageError(
                    "mps needs mem, and there is no earlier run to learn it "
                    "from: give --mem SIZE this time"
                )
            spec = dataclasses.replace(
                spec,
                mem=mem,
                mem_limit=None if mem is None else spec.mem_limit and max(spec.mem_limit, mem),
            )
        never = self._never(spec, gpus)
        if never is not None:  # as select does: exit 2, and nothing queued to wait for ever
            raise UsageError(f"this job can never run here: {never}")
        held = self.group_held(spec)
        job, created = self.store.submit(
            spec,
            self.clock(),
            state=model.QUEUED if held is None else model.HELD,
            reason=held,
            array=array,
        )
        if created and learned is not None:
            self.store.add_event(job.id, "budget_learned", f"mem auto: {learned}", self.clock())
            job = self.store.get(job.id)
        if created and spec.attach is not None:
            self._claim(caller, job)
        if created:
            self.wake()
        return {
            **self.view(caller, job),
            "created": created,
            "dropped_env": dropped,
            "group_held": held if created else None,
            "tasks": None if array is None else len(array.indices),
        }

    def _every_task(self, spec: JobSpec) -> JobSpec:
        """Dependencies on an array's id wait for each of its tasks (jobs/arrays.py);
        ids that name no job stay, for the store to refuse."""

        def every(ids: tuple[int, ...]) -> tuple[int, ...]:
            if not ids:
                return ids
            found, missing = self.store.resolve(list(ids))
            return tuple(sorted({*found, *(m for m in missing if isinstance(m, int))}))

        return dataclasses.replace(
            spec,
            after=every(spec.after),
            after_any=every(spec.after_any),
            after_fail=every(spec.after_fail),
        )

    def _validate(
        self, body: Mapping[str, Any], caller: Caller, gpus: Sequence[GpuState]
    ) -> tuple[JobSpec, list[str]]:
        """``spec_from_request`` with this daemon's GPUs and settings: the one check of
        a request's fields, for submit and edit."""
        from gpuwarden.sched.headroom import capacity

        return spec_from_request(
            body,
            caller,
            len(gpus) or 1 << 16,
            capacities={g.index: capacity(g) for g in gpus},
            oom_retries=self.config.oom_retries,
            max_grace=self.config.max_grace,
        )

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
            raise UsageError(f"cannot edit {', '.join(unknown)} (editable: {', '.join(EDITABLE)})")
        if job.state not in (model.QUEUED, model.HELD):
            raise UsageError(
                f"job {job_id} is {job.state}; only a queued or held job can be edited"
            )
        if body.get("mem") == "auto":
            raise UsageError("mem: give a size (auto is learned at submit)")
        s = job.spec
        was: dict[str, Any] = {
            "mem": s.mem,
            "mem_limit": s.mem_limit,
            "priority": s.priority,
            "qos": s.qos,
            "gpus": s.gpus,
            "timeout": s.timeout,
            "name": s.name,
        }
        # The fields that submit checks together with the editable ones.
        request: dict[str, Any] = {
            "command": list(s.command),
            "gpu_ids": None if s.gpu_ids is None else list(s.gpu_ids),
            "exclusive": s.exclusive,
            "mps": s.mps,
            "sm_percent": s.sm_percent,
            "cpus": s.cpus,
            "no_numa": s.no_numa,
            "mig": s.mig,
            "key": s.key,
            "retries": s.retries,
            **{k: v for k, v in was.items() if v is not None},
            **body,
        }
        if (
            "mem" in body
            and body["mem"] is not None
            and "mem_limit" not in body
            and s.mem_limit is not None
            and s.qos != GUARANTEED
        ):
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
        job = self.store.edit(
            job.id,
            (model.QUEUED, model.HELD),
            changes,
            now=self.clock(),
            detail=f"by {caller.user}: {detail}",
        )
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
        same = failing_streak(
            [
                failure_signature(
                    j.state, j.exit_code, j.reason, any(e.kind == "oom" for e in j.events)
                )
                for j in recent
            ]
        )
        if same is None:
            return None
        if self.store.group_released_since(
            spec.uid, spec.group, max(j.ended_at or 0.0 for j in recent)
        ):
            return None
        return (
            f"group {spec.group}: its last {STREAK} jobs failed the same way ({same}); "
            "held until released"
        )

    def _never(self, spec: JobSpec, gpus: Sequence[GpuState]) -> str | None:
        """Why a job could never run on these GPUs (over every GPU's capacity, more GPUs
        than there are, ...) or for its user (alone over a [limits] value); None when it
        could. Without GPU states yet, the scheduling pass decides (``infeasible``)."""
        from gpuwarden.sched.limits import never_within
        from gpuwarden.sched.placement import infeasible_reason

        if not gpus:
            return None
        job = QueuedJob(
            id=0,
            user=spec.user,
            mem=spec.mem,
            count=spec.gpus,
            gpu_ids=spec.gpu_ids,
            exclusive=spec.exclusive,
            priority=spec.priority,
            qos=spec.qos,
            runtime=spec.timeout,
            cpus=spec.cpus,
            mig=spec.mig,
            mps=spec.mps,
        )
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
            self.store.transition(
                job.id,
                (model.QUEUED,),
                model.CANCELLED,
                now=now,
                kind="cancelled",
                detail=f"cannot attach: {e}",
                reason=f"cannot attach: {e}",
                ended_at=now,
            )
            raise UsageError(f"cannot attach job {job.id}: {e}") from None
