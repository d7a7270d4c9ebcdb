"""Jobs whose supervisor the store does not know, or knows to be gone, settled: after
the daemon (re)starts, a supervisor that kept running is adopted, an end recorded while
the daemon was down collected, a job of an earlier boot lost or queued again, and a
launch that never happened voided; during the passes, a launch cut short and a lost
supervisor are settled the same way (docs/design.md, invariant 3). Which of these a job
needs is ``daemon/reconcile.py``'s rule; this module carries it out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.daemon.placing import requeue_unlaunched
from gpuwarden.daemon.reconcile import ADOPT, FINISH, LOST, REBOOTED, VOID, recovery_step
from gpuwarden.jobs import lifecycle, model
from gpuwarden.jobs.jobdir import job_dir, read_status
from gpuwarden.procs.identity import same_boot

if TYPE_CHECKING:
    from gpuwarden.daemon.store import Store
    from gpuwarden.jobs.jobdir import ExitInfo, SupervisorHandle, SupervisorStatus
    from gpuwarden.jobs.model import Job, NewHold


class Recovery:
    """Owns the settling of active jobs whose supervisor is not (or no longer) what the
    store records: adopting one, voiding an attempt nobody claimed, and the ends of
    jobs lost to a reboot or with their supervisor."""

    def __init__(
        self,
        store: Store,
        jobs_dir: Path,
        boot_id: str,
        clock: Callable[[], float],
        finish: Callable[[Job, ExitInfo], None],
        hold: Callable[[Job, float], NewHold | None],
    ) -> None:
        self.store = store
        self.jobs_dir = jobs_dir
        self.boot_id = boot_id
        self.clock = clock
        self.finish = finish  # collects a recorded end (``ExitCollector.finish``)
        self.hold = hold  # what an ending attempt leaves reserved (``Holds.new``)

    def _status(self, job: Job) -> SupervisorStatus:
        return read_status(job_dir(self.jobs_dir, job))

    def recover(self) -> None:
        """After a (re)start: adopt supervisors that kept running, collect exits recorded
        while the daemon was down, and settle jobs lost to a reboot or an early crash."""
        from gpuwarden.supervisor.control import alive

        for job in self.store.active():
            st = self._status(job)
            step = recovery_step(
                job, st, same_boot=same_boot(job.boot_id, self.boot_id), alive=alive
            )
            if step == FINISH:
                assert st.exit is not None
                self.finish(job, st.exit)
            elif step == REBOOTED:
                self._lost_on_reboot(job)
            elif step == ADOPT:
                assert st.supervisor is not None
                self._adopt(job, st.supervisor)
            elif step == VOID:
                # Reserved, not launched as far as we know. A supervisor the last daemon
                # started may still be coming up (it read spec.json and is about to claim
                # the directory), so voiding the spec is not enough: take its claim
                # first. Whoever creates supervisor.json owns this attempt.
                if self._void_attempt(job):
                    requeue_unlaunched(
                        self.store, job, "the daemon stopped before launching it", self.clock()
                    )
                    continue
                st = self._status(job)  # a supervisor won: adopt it, or collect its end
                if st.exit is None and st.supervisor is not None and alive(st.supervisor):
                    self._adopt(job, st.supervisor)
                else:
                    self.finish_or_lost(job)
            elif step == LOST:
                self.finish_or_lost(job)

    def finish_or_lost(self, job: Job) -> None:
        """A job whose supervisor is gone: collect the end it may have written just now,
        else the job failed, its supervisor lost (what its tree left is a hold's)."""
        st = self._status(job)
        if st.exit is not None:
            self.finish(job, st.exit)
            return
        now = self.clock()
        self.store.transition(
            job.id,
            (model.RESERVED, model.RUNNING),
            model.FAILED,
            now=now,
            kind="lost",
            detail="its supervisor died without recording an exit",
            reason="supervisor lost",
            ended_at=now,
            hold=self.hold(job, now),
        )

    def _adopt(self, job: Job, supervisor: SupervisorHandle) -> None:
        """Record a reserved job's running supervisor, found where the pass that
        launched it could not record it (a restart, a launch cut short)."""
        self.store.transition(
            job.id,
            (model.RESERVED,),
            model.RESERVED,
            now=self.clock(),
            kind=lifecycle.ADOPTED,
            supervisor_pid=supervisor.pid,
            supervisor_start=supervisor.start_time,
            boot_id=self.boot_id,
        )

    def settle_unlaunched(self, job: Job, st: SupervisorStatus) -> None:
        """A reserved job whose launch did not complete: the pass that placed it failed
        before recording the supervisor (a full disk, a failed spawn whose failure could
        not be written either). Adopt the supervisor if one claimed the attempt, else
        void the attempt and queue the job again."""
        from gpuwarden.supervisor.control import alive

        if st.supervisor is not None:
            if alive(st.supervisor):
                self._adopt(job, st.supervisor)
            return  # a dead one: its exit.json, or the lost-supervisor rule, settles it
        if self._void_attempt(job):
            requeue_unlaunched(self.store, job, "its launch did not complete", self.clock())

    def _void_attempt(self, job: Job) -> bool:
        """Make sure no supervisor ever runs this attempt of a job: its claim, taken
        first (``jobdir.void_start``), so exactly one of us gets it. True when the
        attempt is void (now or by an earlier recovery); False when a supervisor claimed
        it first (then it runs the job: adopt it, never requeue)."""
        from gpuwarden.jobs.jobdir import void_start

        return void_start(job_dir(self.jobs_dir, job), "gpuwarden daemon recovery", job=job.id)

    def _lost_on_reboot(self, job: Job) -> None:
        now = self.clock()
        if job.spec.requeue_on_reboot:
            self.store.transition(
                job.id,
                (model.RESERVED, model.RUNNING),
                model.QUEUED,
                now=now,
                kind="requeued",
                detail="the machine rebooted",
                **model.fresh_attempt(job),
            )
        else:
            self.store.transition(
                job.id,
                (model.RESERVED, model.RUNNING),
                model.FAILED,
                now=now,
                kind="lost",
                detail="lost on reboot",
                reason="lost on reboot",
                ended_at=now,
            )
