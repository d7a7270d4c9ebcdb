"""The pass's decisions carried out: a ``Place`` reserves the job's budget on its GPUs
and starts its supervisor (an attached job's launcher is named instead, and starts it
itself), a ``Preempt`` stops its victims. Each state change is written to the store
before the action it records: reserve, then launch (docs/design.md, invariant 2)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.daemon.gpu_states import report_path
from gpuwarden.daemon.mps_jobs import MpsPool, client_env
from gpuwarden.daemon.store_errors import Conflict, JobNotFound
from gpuwarden.jobs import model
from gpuwarden.jobs.jobdir import job_dir
from gpuwarden.units import format_bytes

if TYPE_CHECKING:
    from gpuwarden.daemon.config import Config
    from gpuwarden.daemon.store import Store
    from gpuwarden.jobs.jobdir import SupervisorHandle
    from gpuwarden.jobs.model import Job
    from gpuwarden.observe.snapshot import Snapshot
    from gpuwarden.sched.model import Place, Preempt

log = logging.getLogger("gpuwarden.loop")  # the loop's log: its passes place the jobs
# An attached job is stored, then its launcher named in its directory: a pass between
# the two waits this long for the name before it takes the launcher for gone.
CLAIM_WAIT = 30.0
PREEMPT_NOTICE = "preempt"  # in the attempt directory; GPUWARDEN_PREEMPT_FILE names it


def _report_file(path: Path, uid: int, gid: int) -> None:
    """An empty file the job's cap hook may write its allocator report to: the job
    writes that file alone, never a name of its choosing; a file left by an earlier
    daemon under the same name is replaced."""
    path.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def job_env(job: Job, budget: int, jobdir: Path) -> dict[str, str]:
    """The job's environment on top of its snapshot: its id and budget (and array task),
    the preemption notice file of checkpoint-friendly jobs, and expandable segments for
    PyTorch's allocator (fragmentation otherwise makes a job OOM below its budget) unless
    the user chose allocator settings."""
    env = {
        **job.spec.env,
        "GPUWARDEN_JOB": str(job.id),
        "GPUWARDEN_BUDGET": str(budget),
        "GPUWARDEN_QOS": job.spec.qos,
    }
    if job.spec.array is not None:  # as Slurm's SLURM_ARRAY_JOB_ID and _TASK_ID
        env["GPUWARDEN_ARRAY_ID"] = str(job.spec.array.array_id)
        env["GPUWARDEN_ARRAY_INDEX"] = str(job.spec.array.index)
    if job.spec.checkpoint:
        env["GPUWARDEN_PREEMPT_FILE"] = str(jobdir / PREEMPT_NOTICE)
    if (
        job.request is not None
        and "PYTORCH_CUDA_ALLOC_CONF" not in env
        and "PYTORCH_ALLOC_CONF" not in env
    ):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def requeue_unlaunched(store: Store, job: Job, why: str, now: float) -> None:
    """A reserved job whose attempt no supervisor will run (its launch failed before
    anything of it ran, or recovery voided it) queued again as a fresh attempt."""
    store.transition(
        job.id,
        (model.RESERVED,),
        model.QUEUED,
        now=now,
        kind="requeued",
        detail=why,
        **model.fresh_attempt(job),
    )


class Placer:
    """Owns starting a placed job (its reservation, environment, supervisor spec and
    supervisor, or its launcher named), an attached job's wait for its launcher, and
    stopping the victims of a preemption with their notice."""

    def __init__(
        self,
        store: Store,
        config: Config,
        jobs_dir: Path,
        boot_id: str,
        clock: Callable[[], float],
        spawn: Callable[[Path], SupervisorHandle] | None,
        mps: MpsPool,
        booked_context: Callable[[Iterable[int]], int],
        context_ceiling: Callable[[Job], int],
        cancel_running: Callable[[Job], None],
    ) -> None:
        self.store = store
        self.config = config
        self.jobs_dir = jobs_dir
        self.boot_id = boot_id
        self.clock = clock
        self.spawn = spawn  # starts a supervisor (the daemon's fork server); None: fresh
        self.mps = mps  # the MPS daemons of --mps jobs
        self.booked_context = booked_context  # the CUDA context booked per GPU
        self.context_ceiling = context_ceiling  # the largest context allowed a placed job
        self.cancel_running = cancel_running  # asks a job's supervisor to end it

    def preempt(self, job: Job, d: Preempt) -> None:
        """Stop the victims so ``job`` can start: record the preemption on each (written
        before the signal), leave the notice file for checkpoint-friendly jobs, then ask
        its supervisor to end it (SIGTERM, the job's grace, SIGKILL). Its end is then a
        requeue (``ExitCollector.finish``); ``job`` waits until their memory is back."""
        now = self.clock()
        for victim_id in d.victims:
            try:
                victim = self.store.transition(
                    victim_id,
                    model.ACTIVE,
                    None,
                    now=now,
                    kind="preempted",
                    detail=f"for job {job.id}: {d.reason}",
                    preempting_at=now,
                )
            except (Conflict, JobNotFound):
                continue  # it ended meanwhile: its room is coming back anyway
            if victim.spec.checkpoint:
                self._write_preempt_notice(victim, job, now)
            self.cancel_running(victim)
        self.store.set_reason(
            job.id, f"waiting for preempted job(s) {', '.join(map(str, d.victims))} to stop"
        )

    def _write_preempt_notice(self, victim: Job, job: Job, now: float) -> None:
        path = job_dir(self.jobs_dir, victim) / PREEMPT_NOTICE
        grace = self.config.grace_of(victim.spec.grace)
        try:
            fd = os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
            )
            with os.fdopen(fd, "w") as f:
                json.dump({"job": victim.id, "preempted_by": job.id, "at": now, "grace": grace}, f)
                f.write("\n")
        except OSError as e:
            log.warning("cannot write the preemption notice of job %s: %s", victim.id, e)

    def waiting_launcher(self, job: Job) -> SupervisorHandle | None:
        """The launcher of a queued attached job. One that went away before the job was
        placed has its job cancelled (nobody would start it): None then."""
        from gpuwarden.daemon.attached import live_launcher
        from gpuwarden.jobs.jobdir import SUPERVISOR

        jobdir = job_dir(self.jobs_dir, job)
        # Whether the launcher was named is looked at before its record is read: the API
        # writes the claim (once, atomically) in another thread right after it stores the
        # job, and a claim that appeared between a read that missed it and a look that
        # found it was taken for a launcher gone.
        named = (jobdir / SUPERVISOR).exists()
        handle = live_launcher(jobdir)
        if handle is not None:
            return handle
        if not named and self.clock() - job.submitted_at < CLAIM_WAIT:
            return None  # stored, its launcher not yet named (the API names it next)
        with contextlib.suppress(Conflict, JobNotFound):
            self.store.transition(
                job.id,
                (model.QUEUED,),
                model.CANCELLED,
                now=self.clock(),
                kind="cancelled",
                detail="its launcher went away",
                reason=f"its launcher ({job.spec.attach}) went away before it was placed",
                ended_at=self.clock(),
            )
        return None

    def _reserve_attached(self, job: Job, place: Place, snap: Snapshot) -> None:
        """Place an attached job: reserve its budget and name its launcher as its
        supervisor, in one transition. The launcher, which polls the job, then starts
        the command on these GPUs with this budget and reports the start."""
        handle = self.waiting_launcher(job)
        if handle is None:
            return
        facts = {g.index: g.facts for g in snap.gpus}
        uuids = place.uuids or tuple(facts[i].uuid for i in place.gpus)
        self.store.transition(
            job.id,
            (model.QUEUED,),
            model.RESERVED,
            now=self.clock(),
            kind="placed",
            detail=f"GPU {','.join(map(str, place.gpus))}, {format_bytes(place.budget)} "
            f"each; started by {job.spec.attach} (pid {handle.pid})",
            gpus=place.gpus,
            gpu_uuids=uuids,
            budget=place.budget,
            cpu_set=place.cpus,
            reason=None,
            supervisor_pid=handle.pid,
            supervisor_start=handle.start_time,
            boot_id=self.boot_id,
            context=self.booked_context(place.gpus),
        )

    def launch(self, job: Job, place: Place, snap: Snapshot) -> None:
        if job.spec.attach is not None:
            self._reserve_attached(job, place, snap)
            return
        from gpuwarden.gpus.visible import devices
        from gpuwarden.jobs.jobdir import write_spec
        from gpuwarden.launch import plan_launch, probe_host
        from gpuwarden.supervisor.spawn import NotStarted, spawn_supervisor, spec_from_plan

        facts = {g.index: g.facts for g in snap.gpus}
        places = {d.uuid: d for d in devices([g.facts for g in snap.gpus])}
        # a MIG instance is a device of its own, named by its MIG- UUID
        chosen = [places[u] for u in place.uuids] if place.uuids else [facts[i] for i in place.gpus]
        budget_text = format_bytes(place.budget)
        context = self.booked_context(place.gpus)
        job = self.store.transition(
            job.id,
            (model.QUEUED,),
            model.RESERVED,
            now=self.clock(),
            kind="placed",
            detail=f"GPU {','.join(map(str, place.gpus))}, {budget_text} each "
            f"(+ {format_bytes(context)} CUDA context)",
            gpus=place.gpus,
            gpu_uuids=tuple(f.uuid for f in chosen),
            budget=place.budget,
            cpu_set=place.cpus,
            reason=None,
            context=context,
        )
        try:
            d = job_dir(self.jobs_dir, job)
            report = report_path(self.jobs_dir, job)
            env = {
                **job_env(job, place.budget, d),
                "GPUWARDEN_CONTEXT_BYTES": str(context),
                "GPUWARDEN_ALLOCATOR_REPORT": str(report),
            }
            launch = plan_launch(
                job.spec.command,
                chosen,
                base_env=env,
                host=probe_host(env),
                mem_limit=job.cap(place.budget),
                bind=not job.spec.no_numa,
                cores=frozenset(place.cpus) if place.cpus else None,
            )
            if job.spec.mps:
                # MPS limits the whole client, its CUDA context inside the limit: the
                # context as the watchdog allows it (contexts differ by their kernels).
                control = self.mps.ensure(job.spec.uid, job.spec.gid, place.gpus)
                limit = (job.cap(place.budget) or place.budget) + self.context_ceiling(job)
                launch = dataclasses.replace(
                    launch,
                    env={
                        **launch.env,
                        **client_env(control, place.gpus, limit, job.spec.sm_percent),
                    },
                )
            grace = self.config.grace_of(job.spec.grace)
            write_spec(
                d,
                spec_from_plan(
                    job.id,
                    launch,
                    job.spec.command,
                    cwd=job.spec.cwd,
                    uid=job.spec.uid,
                    gid=job.spec.gid,
                    groups=job.spec.groups,
                    timeout=job.spec.timeout,
                    grace=grace,
                ),
            )
            _report_file(report, job.spec.uid, job.spec.gid)
            if job.spec.checkpoint:
                d.chmod(0o711)  # the job may look up its notice file, not list the rest
            handle = (self.spawn or spawn_supervisor)(d)
        except NotStarted as e:  # proven: nothing of it ran
            log.warning("launching job %s failed before it started (%s); queued again", job.id, e)
            requeue_unlaunched(self.store, job, str(e), self.clock())
            return
        except Exception as e:
            log.exception("launching job %s failed", job.id)
            self.store.transition(
                job.id,
                (model.RESERVED,),
                model.FAILED,
                now=self.clock(),
                kind="launch_failed",
                detail=str(e),
                reason=f"launch failed: {e}",
                ended_at=self.clock(),
            )
            return
        try:
            self.store.transition(
                job.id,
                (model.RESERVED,),
                model.RESERVED,
                now=self.clock(),
                kind="launched",
                detail=f"supervisor pid {handle.pid}; {launch.describe()}"
                + "".join(f"; {n}" for n in launch.notes),
                supervisor_pid=handle.pid,
                supervisor_start=handle.start_time,
                boot_id=self.boot_id,
            )
        except Conflict:
            # Cancelled through the API while we launched it (a reserved job without a
            # supervisor is cancelled in the store alone): stop what we started.
            log.info("job %s was cancelled while launching; stopping it", job.id)
            self.cancel_running(job)
