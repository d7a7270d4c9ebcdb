"""What a caller may ask of jobs that exist: cancel (one, or many by id, reference or
group), hold, release, retry, clear an unverified memory reservation, remove and clean.
Each is one transition of the store, checked against who asks, so these stand apart
from taking jobs in (daemon/admission.py) and reading them (daemon/service.py, whose
JobService holds both)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.client.views import JobDoc
from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.store import Store
from gpuwarden.daemon.store_errors import Conflict
from gpuwarden.errors import PermissionDenied, UsageError
from gpuwarden.jobs import model
from gpuwarden.jobs.model import Job

CANCEL_TRIES = 3
"""Reads of a job a cancel may take while passes keep moving it on (queued, placed,
started): each lost compare-and-set reads it again."""


@dataclass(frozen=True)
class JobActions:
    """The job actions for one caller. ``owned`` reads a job the caller may act on (else
    ``PermissionDenied``, naming the verb), ``may`` is the same check of a job already
    read and ``is_admin`` the daemon's admin check; ``view`` is the job's JSON for the
    caller; ``wake`` nudges the scheduler loop; ``cancel_running`` asks a placed job's
    supervisor to end it (with SIGKILL at once when told to kill)."""

    store: Store
    jobs_dir: Path
    owned: Callable[[Caller, int, str], Job]
    may: Callable[[Caller, Job], bool]
    is_admin: Callable[[Caller], bool]
    view: Callable[[Caller, Job], JobDoc]
    wake: Callable[[], None]
    cancel_running: Callable[[Job, bool], None]
    clock: Callable[[], float] = time.time

    def cancel(self, caller: Caller, job_id: int, kill: bool = False) -> JobDoc:
        """End a job; a running one gets SIGTERM and its grace, or with ``kill`` SIGKILL
        at once (also when an earlier cancel is still in its grace)."""
        job = self._cancel(caller, self.owned(caller, job_id, "cancel"), kill)
        self.wake()
        return self.view(caller, job)

    def resolve(self, caller: Caller, refs: Any) -> dict[str, Any]:
        """The job ids that references name (``3-7``, ``12`` for every task of array 12,
        ``12_7`` one task), and those that name nothing: what the CLI acts on. Any user
        may ask (``ps`` shows every job to everyone)."""
        from gpuwarden.jobs.arrays import parse_refs

        if (
            not isinstance(refs, list)
            or not refs
            or len(refs) > 10_000
            or not all(isinstance(r, str) and r[:1].isascii() and r[:1].isdigit() for r in refs)
        ):
            raise UsageError("refs must be a list of 1 to 10000 strings such as 3, 3-7 or 12_7")
        ids, missing = self.store.resolve(parse_refs(refs))
        return {
            "ids": ids,
            "missing": [r if isinstance(r, int) else f"{r[0]}_{r[1]}" for r in missing],
        }

    def cancel_many(
        self,
        caller: Caller,
        ids: Sequence[int],
        group: str | None,
        kill: bool = False,
        refs: Any = (),
    ) -> dict[str, Any]:
        """``cancel 1-100000``, ``cancel 12_7`` and ``cancel --group`` in one request: the
        jobs named by id or reference (``resolve``; read in one query), and the caller's
        waiting and running jobs of ``group``. Each job that cannot be cancelled (not the
        caller's, already ended) is an error of its own; ids and references that name no
        job are listed once, in ``missing``."""
        named: list[str | int] = []
        if refs:
            resolved = self.resolve(caller, refs)
            ids, named = [*ids, *resolved["ids"]], resolved["missing"]
        jobs = {j.id: j for j in self.store.list(ids=ids, with_events=False)} if ids else {}
        if group is not None:
            waiting = [s for s in model.STATES if s not in model.TERMINAL]
            jobs.update(
                (j.id, j)
                for j in self.store.list(
                    states=waiting, user=caller.user, group=group, with_events=False
                )
            )
        done: list[JobDoc] = []
        errors: list[dict[str, Any]] = []
        for job_id in sorted(jobs):
            try:
                if not self.may(caller, jobs[job_id]):
                    raise PermissionDenied(
                        f"job {job_id} belongs to {jobs[job_id].user}; "
                        "only its owner or an admin may cancel it"
                    )
                done.append(self.view(caller, self._cancel(caller, jobs[job_id], kill)))
            except (UsageError, PermissionDenied, Conflict) as e:
                errors.append({"id": job_id, "error": str(e)})
        if done:
            self.wake()
        return {"jobs": done, "errors": errors, "missing": [*sorted(set(ids) - set(jobs)), *named]}

    def _cancel(self, caller: Caller, job: Job, kill: bool) -> Job:
        """Cancel the job as it is now: a pass that placed or started it since it was
        read (the compare-and-set lost) is no reason to leave it running, so the job is
        read again and cancelled in its new state."""
        for _ in range(CANCEL_TRIES - 1):
            try:
                return self._cancel_as_read(caller, job, kill)
            except Conflict:
                job = self.store.get(job.id)
        return self._cancel_as_read(caller, job, kill)

    def _cancel_as_read(self, caller: Caller, job: Job, kill: bool) -> Job:
        job_id = job.id
        now = self.clock()
        if job.state in (model.QUEUED, model.HELD) or (
            job.state == model.RESERVED and job.supervisor_pid is None
        ):
            job = self.store.transition(
                job.id,
                (job.state,),
                model.CANCELLED,
                now=now,
                kind="cancelled",
                detail=f"by {caller.user}",
                reason=f"cancelled by {caller.user}",
                ended_at=now,
            )
        elif job.state in model.ACTIVE:
            self.store.add_event(
                job.id,
                "cancel_requested",
                f"by {caller.user}" + (" (SIGKILL)" if kill else ""),
                now,
            )
            self.cancel_running(job, kill)
            job = self.store.get(job.id)
        else:
            raise UsageError(f"job {job_id} is already {job.state}")
        return job

    def hold(self, caller: Caller, job_id: int) -> JobDoc:
        job = self.owned(caller, job_id, "hold")
        if job.state != model.QUEUED:
            raise UsageError(f"job {job_id} is {job.state}; only a queued job can be held")
        job = self.store.transition(
            job.id,
            (model.QUEUED,),
            model.HELD,
            now=self.clock(),
            kind="held",
            detail=f"by {caller.user}",
            reason=f"held by {caller.user}",
        )
        return self.view(caller, job)

    def release(self, caller: Caller, job_id: int) -> JobDoc:
        job = self.owned(caller, job_id, "release")
        if job.state != model.HELD:
            raise UsageError(f"job {job_id} is {job.state}, not held")
        job = self.store.transition(
            job.id,
            (model.HELD,),
            model.QUEUED,
            now=self.clock(),
            kind="released",
            detail=f"by {caller.user}",
            reason=None,
        )
        self.wake()
        return self.view(caller, job)

    def unreserve(self, caller: Caller, job_id: int) -> JobDoc:
        """Clear the memory an ended job still holds because it was not verified back (a
        leak): admins only, since it hands that memory to other jobs."""
        if not self.is_admin(caller):
            raise PermissionDenied("only root or an admin may clear a job's memory reservation")
        job = self.store.get(job_id)
        opened = [h for h in self.store.open_holds() if h.job_id == job_id]
        if not opened:
            raise UsageError(f"job {job_id} holds no memory that is waiting to come back")
        for h in opened:
            self.store.close_hold(
                h.id,
                self.clock(),
                model.CLEARED_BY + caller.user,
                kind="memory_cleared",
                detail=f"hold released by {caller.user}; the memory was "
                "not verified back" + (f": {h.leak}" if h.leak else ""),
            )
        self.wake()
        return self.view(caller, self.store.get(job.id))

    def retry(self, caller: Caller, job_id: int) -> JobDoc:
        job = self.owned(caller, job_id, "retry")
        if job.state not in (model.FAILED, model.CANCELLED, model.INFEASIBLE):
            raise UsageError(
                f"job {job_id} is {job.state}; only a failed, cancelled or "
                "infeasible job can be retried"
            )
        if job.spec.attach is not None:
            raise UsageError(
                f"job {job_id} was started by its launcher ({job.spec.attach}); retry it there"
            )
        job = self.store.transition(
            job.id,
            (job.state,),
            model.QUEUED,
            now=self.clock(),
            kind="retried",
            detail=f"by {caller.user}",
            reason=None,
            ended_at=None,
            **model.fresh_attempt(job),
        )
        self.wake()
        return self.view(caller, job)

    def remove(self, caller: Caller, job_id: int) -> None:
        job = self.owned(caller, job_id, "remove")
        if not job.terminal:
            raise UsageError(f"job {job_id} is {job.state}; cancel it before removing it")
        self.store.delete(job.id)
        shutil.rmtree(self.jobs_dir / str(job.id), ignore_errors=True)

    def clean(self, caller: Caller, older_than: float) -> int:
        cutoff = self.clock() - older_than
        removed = 0
        for job in self.store.list(
            states=sorted(model.TERMINAL), with_events=False, with_env=False
        ):
            if job.ended_at is not None and job.ended_at < cutoff and self.may(caller, job):
                try:
                    self.store.delete(job.id)
                except Conflict:
                    continue  # a waiting job still depends on it: keep it until that one ends
                shutil.rmtree(self.jobs_dir / str(job.id), ignore_errors=True)
                removed += 1
        return removed
