"""The scheduling loop: one pass (a tick) reconciles the active jobs with their
supervisors, observes the GPUs, asks the placement policy, and carries out its decisions
— each state change written to the store before the action it records (reserve, then
launch). The pass's order is here; what each step does belongs to a collaborator: a
job's end (``exits``), a supervisor not recorded or lost (``recovery``), an ended
attempt's memory (``holds``), the GPU states planned with (``gpu_states``), placements
and preemptions carried out (``placing``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.daemon.accounting import FairUsage
from gpuwarden.daemon.config import Config
from gpuwarden.daemon.exits import ExitCollector
from gpuwarden.daemon.gpu_states import GpuStates, driver_limit
from gpuwarden.daemon.holds import Holds
from gpuwarden.daemon.mps_jobs import MpsPool
from gpuwarden.daemon.mps_jobs import key as mps_key
from gpuwarden.daemon.notify import Notifier
from gpuwarden.daemon.placing import Placer
from gpuwarden.daemon.queueview import learned_runtime, queued_view
from gpuwarden.daemon.reconcile import (
    FINISH,
    LOST,
    SETTLE,
    STARTED,
    pass_step,
)
from gpuwarden.daemon.recovery import Recovery
from gpuwarden.daemon.restart import HealthChecks
from gpuwarden.daemon.store_errors import Conflict, JobNotFound
from gpuwarden.jobs import model
from gpuwarden.jobs.jobdir import job_dir
from gpuwarden.jobs.model import Hold, Job
from gpuwarden.sched.model import GpuState, Infeasible, Place, Preempt, QueuedJob, Wait

if TYPE_CHECKING:
    from gpuwarden.daemon.store import Store
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.jobs.jobdir import SupervisorHandle, SupervisorStatus
    from gpuwarden.observe.snapshot import Snapshot

log = logging.getLogger("gpuwarden.loop")


class Scheduler:
    """The daemon's reconcile loop: runs a pass (``tick``) and the recovery after a
    restart (``recover``), and holds the collaborators that carry their steps out; the
    running jobs' health and limits, the memory history and the queue's dependencies
    are watched here, between the steps."""

    def __init__(
        self,
        store: Store,
        jobs_dir: Path,
        config: Config,
        backend: Callable[[], Backend],
        boot_id: str,
        clock: Callable[[], float] = time.time,
        spawn: Callable[[Path], SupervisorHandle] | None = None,
        mps: MpsPool | None = None,
        on_pass: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.on_pass = on_pass  # told each pass's duration (the metrics histogram)
        self.last_running: list[dict[str, Any]] = []  # running jobs' use, last pass
        self.mps = mps or MpsPool(jobs_dir.parent / "mps")
        self.jobs_dir = jobs_dir
        self.config = config
        self.fair_usage = FairUsage(store, config.policy.fairshare_halflife, clock)
        self.backend = backend
        self.clock = clock
        self._backend: Backend | None = None
        self._watched: set[tuple[int, int, str]] = set()  # (job, attempt, action) recorded
        self._estimates: dict[int, float | None] = {}  # job id -> learned run time
        self._last_sample = float("-inf")  # when memory history was last recorded
        self._mps_in_use: set[str] | None = None  # MPS daemons running jobs used last pass
        self.health = HealthChecks()  # services' health checks, beside the passes
        self.notifier = Notifier(config.webhook)  # word of each job's end, beside them
        self.gpus = GpuStates(store, config, jobs_dir, clock, self._estimate)
        self.holds = Holds(
            store, config, jobs_dir, clock, self._open_backend, self.gpus.unaccounted_seen
        )
        self.exits = ExitCollector(store, config, jobs_dir, clock, self.gpus, self.holds)
        self.recovery = Recovery(store, jobs_dir, boot_id, clock, self.exits.finish, self.holds.new)
        self.placer = Placer(
            store,
            config,
            jobs_dir,
            boot_id,
            clock,
            spawn,
            self.mps,
            self.gpus.booked_context,
            self.gpus.context_ceiling,
            self.cancel_running,
        )
        store.on_end = self.notifier.ended

    @property
    def last_states(self) -> list[GpuState]:
        """The GPU states the last pass planned with."""
        return self.gpus.last

    # -- supervisor bookkeeping --------------------------------------------------------
    def jobdir(self, job: Job) -> Path:
        return job_dir(self.jobs_dir, job)

    def _check_health(self, active: list[Job]) -> None:
        """Take the health-check failures found since the last pass (the checks run in
        threads, never in the pass) and stop those services: SIGTERM, their grace,
        SIGKILL; their end is then a failure their restart policy restarts from."""
        from gpuwarden.jobs.lifecycle import HEALTH_FAILED

        running = [
            j
            for j in active
            if j.state == model.RUNNING
            and j.spec.service
            and j.preempting_at is None
            and j.kill_reason is None
        ]
        if not running and not self.health.busy:
            return
        now = self.clock()
        for job, why in self.health.poll(running, now):
            try:
                self.store.transition(
                    job.id,
                    (model.RUNNING,),
                    None,
                    now=now,
                    kind=HEALTH_FAILED,
                    detail=why,
                    kill_reason=f"health check failed: {why}",
                    health_failures=job.health_failures + 1,
                )
            except (Conflict, JobNotFound):
                continue
            self.cancel_running(job)

    def _status(self, job: Job) -> SupervisorStatus:
        from gpuwarden.jobs.jobdir import read_status

        return read_status(self.jobdir(job))

    def cancel_running(self, job: Job, kill: bool = False) -> None:
        from gpuwarden.supervisor.control import cancel

        cancel(self.jobdir(job), kill=kill)

    def recover(self) -> None:
        """Settle the active jobs once after the daemon (re)starts, before its passes."""
        self.recovery.recover()

    # -- one pass -----------------------------------------------------------------------
    def _open_backend(self) -> Backend:
        if self._backend is None:
            self._backend = self.backend()
        return self._backend

    def tick(self) -> None:
        started = time.perf_counter()
        try:
            self._tick()
        finally:
            if self.on_pass is not None:
                self.on_pass(time.perf_counter() - started)

    def _tick(self) -> None:
        from gpuwarden.observe.snapshot import take_snapshot
        from gpuwarden.supervisor.control import alive

        # 1. Reconcile active jobs with what their supervisors recorded.
        for job in self.store.active():
            st = self._status(job)
            step = pass_step(job, st, alive)
            if step == FINISH:
                assert st.exit is not None
                self.exits.finish(job, st.exit)
            elif step == SETTLE:
                self.recovery.settle_unlaunched(job, st)
            elif step == STARTED:
                assert st.child is not None
                self.store.transition(
                    job.id,
                    (model.RESERVED,),
                    model.RUNNING,
                    now=self.clock(),
                    kind="started",
                    detail=f"pid {st.child.pid}",
                    started_at=st.child.started_at or self.clock(),
                )
            elif step == LOST:
                self.recovery.finish_or_lost(job)

        # 2. Observe: one snapshot, job trees, peaks.
        backend = self._open_backend()
        snap = take_snapshot(backend, holders=False, detail=False)
        active = self.store.active()
        # MPS daemons no running job uses any more are quit.
        in_use = {mps_key(j.spec.uid, j.gpus) for j in active if j.spec.mps}
        if in_use != self._mps_in_use and self.mps.root.is_dir():  # a job left one
            self.mps.prune(in_use)
        self._mps_in_use = in_use
        self._check_health(active)
        for job_id, kind, detail in self.notifier.poll():  # failures, sent meanwhile
            with contextlib.suppress(JobNotFound):
                self.store.add_event(job_id, kind, detail, self.clock())
        managed_pids: set[int] = set()
        used: dict[int, dict[str, int]] = {}  # job id -> GPU uuid -> bytes its tree uses
        for job in active:
            if job.supervisor_pid is None:
                continue
            tree = {p.pid for p in self.holds.record_tree(job.id, job.supervisor_pid)}
            managed_pids |= tree
            per_gpu: dict[str, int] = {}
            for g in snap.gpus:
                for p in g.processes:
                    if p.pid in tree and p.memory is not None:
                        per_gpu[g.facts.uuid] = per_gpu.get(g.facts.uuid, 0) + p.memory
            used[job.id] = per_gpu
            if per_gpu:
                self.store.set_peak(job.id, max(per_gpu.values()))
        if any(j.spec.mps for j in active):
            managed_pids |= self.mps.server_pids()
        holds = self.holds.verify(snap)
        self.gpus.update(snap, active, managed_pids, used, holds, self.holds.seen_pids)
        index = {v.facts.uuid: v.facts.index for v in snap.gpus}
        self.last_running = [  # limits as the driver counts (its figures hold the context)
            {
                "id": j.id,
                "user": j.user,
                "qos": j.spec.qos,
                "limit": driver_limit(j.cap(j.budget), self.gpus.context_ceiling(j)),
                "used": {str(index[u]): b for u, b in used.get(j.id, {}).items() if u in index},
            }
            for j in active
            if j.state == model.RUNNING
        ]

        self._record_history(snap, used, managed_pids, holds)

        # 3. Decide and act; then hold running jobs to their limits.
        room_wanted = self._schedule(snap)
        self._watch(active, used, room_wanted)

    def _record_history(
        self,
        snap: Snapshot,
        used: dict[int, dict[str, int]],
        managed_pids: set[int],
        holds: list[Hold],
    ) -> None:
        """Keep a memory sample of every GPU each ``history_interval`` (the web page's
        charts). A full disk costs the history, never the scheduling pass."""
        now = self.clock()
        interval = self.config.history_interval
        if interval <= 0 or now - self._last_sample < interval:
            return
        from gpuwarden.daemon.history import sample_gpus
        from gpuwarden.daemon.store_errors import StoreError

        self._last_sample = now
        try:
            leftovers = {pid: h.job_id for h in holds for pid in h.pids}
            self.store.record_samples(
                sample_gpus(snap, used, managed_pids, now, leftovers),
                keep=self.config.history_retention,
                now=now,
            )
        except StoreError as e:
            log.warning("memory history not recorded: %s", e)

    def _watch(self, active: list[Job], used: dict[int, dict[str, int]], room_wanted: bool) -> None:
        """The watchdog: a running job past its limit is noted, warned about or killed,
        per its class (``sched/watchdog.py``); each finding is one event per attempt."""
        from gpuwarden.sched.watchdog import KILL, check

        index = {g.uuid: g.index for g in self.gpus.last}
        for job in active:
            if (
                job.state != model.RUNNING
                or job.budget is None
                or job.preempting_at
                or job.kill_reason
            ):
                continue
            # The driver's figures hold the job's CUDA context: so do its limits here,
            # with the spread of contexts on its GPU model (not a kill for kernels).
            context = self.gpus.context_ceiling(job)
            request = job.budget + context if job.request is not None else None
            by_index = {
                str(index[uuid]): b for uuid, b in used.get(job.id, {}).items() if uuid in index
            }
            d = check(
                job.id,
                job.spec.qos,
                request,
                driver_limit(job.cap(job.budget), context),
                by_index,
                room_wanted,
            )
            if d is None:
                continue
            key = (job.id, job.attempts, d.action)
            if key in self._watched:
                continue
            self._watched.add(key)
            now = self.clock()
            if d.action != KILL:
                self.store.add_event(job.id, "over_budget", d.detail, now)
                continue
            try:
                self.store.transition(
                    job.id,
                    (model.RUNNING,),
                    None,
                    now=now,
                    kind="killed_over_limit",
                    detail=d.detail,
                    kill_reason=f"killed: {d.detail}",
                )
            except (Conflict, JobNotFound):
                continue
            self.cancel_running(job)

    def _schedule(self, snap: Snapshot) -> bool:
        """Plan and carry out one pass. Returns whether a job waits for room (the
        watchdog is stricter then)."""
        from gpuwarden.sched.arrays import throttle
        from gpuwarden.sched.queue import plan

        # Without environments: a launch reads its job again (``store.transition``).
        queued = self.store.list(states=[model.QUEUED], with_env=False)
        ready: list[Job] = []
        for job in queued:
            if job.spec.attach is not None and self.placer.waiting_launcher(job) is None:
                continue
            blocked = self._dependency_block(job)
            if blocked is None:
                ready.append(job)
        ready, throttled = throttle(
            ready, self.store.list(states=sorted(model.ACTIVE), with_env=False, with_events=False)
        )
        self.store.set_reasons(throttled)
        if not ready:
            return False
        room_wanted = False
        by_id = {j.id: j for j in ready}
        now = self.clock()
        fair = self.fair_usage.get()
        views = [self._view(j, now) for j in ready]
        if fair:
            views = [dataclasses.replace(v, fair_usage=fair.get(v.user, 0.0)) for v in views]
        for d in plan(
            self.gpus.last, views, self.config.spike_buffer, now=now, policy=self.config.policy
        ):
            job = by_id[d.job_id]
            if isinstance(d, Preempt):
                self.placer.preempt(job, d)
            elif isinstance(d, Place):
                self.placer.launch(job, d, snap)
                # Later jobs in this pass were planned with this reservation applied.
            elif isinstance(d, Wait):
                room_wanted = room_wanted or d.cause in ("room", "preemption")
                self.store.set_reason(job.id, d.reason)
            elif isinstance(d, Infeasible):
                self.store.transition(
                    job.id,
                    (model.QUEUED,),
                    model.INFEASIBLE,
                    now=self.clock(),
                    kind="infeasible",
                    detail=d.reason,
                    reason=d.reason,
                    ended_at=self.clock(),
                )
        return room_wanted

    def _view(self, job: Job, now: float) -> QueuedJob:
        """The queued job as placement sees it; a restarted service prefers the GPUs its
        ended attempt ran on (its latest hold names them)."""
        view = queued_view(job, self._estimate(job), now)
        if job.spec.service is None or not job.restarts or job.release is None:
            return view
        index = {g.uuid: g.index for g in self.gpus.last}
        prefer = tuple(index[u] for u in job.release.gpu_uuids if u in index)
        if len(prefer) != len(job.release.gpu_uuids):
            return view
        return dataclasses.replace(view, prefer=prefer)

    def _estimate(self, job: Job) -> float | None:
        """The job's learned run time (backfill's estimate), read from the store once per
        job: its history changes little while it waits and runs."""
        if job.id not in self._estimates:
            if len(self._estimates) > 4096:
                self._estimates.clear()  # ended jobs' entries: read again when needed
            self._estimates[job.id] = learned_runtime(self.store, job)[0]
        return self._estimates[job.id]

    def _dependency_block(self, job: Job) -> str | None:
        """None when every dependency is met; else why it waits. A dependency that can
        never be met (--after on a job that did not succeed, --after-fail on one that
        did, one removed) cancels the job, saying which."""
        from gpuwarden.sched.queue import dependency_state

        s = job.spec
        for kind, ids in (
            ("after", s.after),
            ("after_any", s.after_any),
            ("after_fail", s.after_fail),
        ):
            for dep_id in ids:
                try:
                    state: str | None = self.store.get(dep_id).state
                except JobNotFound:
                    state = None
                met, why = dependency_state(kind, dep_id, state)
                if met:
                    continue
                if why is not None:
                    self.store.transition(
                        job.id,
                        (model.QUEUED,),
                        model.CANCELLED,
                        now=self.clock(),
                        kind="dependency_failed",
                        detail=why,
                        reason=why,
                        ended_at=self.clock(),
                    )
                    return why
                self.store.set_reason(job.id, f"waiting for job {dep_id} ({state})")
                return "waiting"
        return None
