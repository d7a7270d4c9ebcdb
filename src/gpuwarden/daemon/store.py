"""The daemon's state: jobs and their event history in one SQLite database.

Invariant 2 lives here: a job is in exactly one state (one ``state`` column), and every
change of state is one transaction that moves the job *and* appends the event that
records it, committed before the caller acts on it (reserve, commit, then launch).
Invariant 3 follows: a killed daemon leaves the database at its last commit, so no job
is lost and, with compare-and-set transitions, no job is started twice.

How the file is opened and kept (WAL, an fsync at each commit, one connection behind a
lock, a fresh one after fork): ``daemon/database.py``. The tables, and how an older file
is brought up to date: ``daemon/schema.py``; rows to the model's values and back:
``daemon/rows.py``. Each ``Store`` method is one transaction of that file; the SQL it
runs lives with what it keeps: ``job_queries.py`` (reading jobs), ``job_changes.py``
(writing them: submit, transition, edit), ``events.py`` (their history, notes, the
audit), ``holds.py`` (memory holds), ``learned.py`` (what ended jobs teach),
``measurements.py`` (memory and CUDA context samples), ``maintenance.py`` (removing
jobs, the integrity check), ``drains.py``.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpuwarden.daemon.database import Database
from gpuwarden.daemon.rows import check_spec, ints_ok
from gpuwarden.daemon.sql import (
    drains,
    events,
    holds,
    job_changes,
    job_queries,
    learned,
    maintenance,
    measurements,
)
from gpuwarden.daemon.store_errors import JobNotFound
from gpuwarden.jobs import lifecycle
from gpuwarden.jobs.arrays import Array, Ref
from gpuwarden.jobs.model import ACTIVE, QUEUED, TERMINAL, Event, Hold, Job, JobSpec, NewHold
from gpuwarden.sched.fairshare import Span

if TYPE_CHECKING:
    from gpuwarden.daemon.history import GpuSample


class Store(Database):
    """Jobs and events in SQLite. Every method is one transaction; every mutation that
    changes a job's state appends its event in the same transaction. Thread-safe (one
    connection behind a lock); several processes may open the same file."""

    # Set on an instance where used (the class's are the defaults, so Store takes
    # Database's arguments as they are).
    on_end: Callable[[Job], None] | None = None  # after a job's final transition
    _light_columns: str | None = None  # the listing without environments

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------

    def _columns_but_env(self) -> str:
        """The jobs table's columns, env read as NULL (read once)."""
        if self._light_columns is None:
            with self._tx(write=False) as conn:
                self._light_columns = job_queries.columns_but_env(conn)
        return self._light_columns

    def get(self, job_id: int) -> Job:
        """The job with its events (oldest first); JobNotFound when there is none."""
        if not ints_ok(job_id):
            raise JobNotFound(job_id)
        with self._tx(write=False) as conn:
            return job_queries.load(conn, job_id)

    def list(
        self,
        states: Iterable[str] | None = None,
        user: str | None = None,
        group: str | None = None,
        ids: Iterable[int] | None = None,
        limit: int | None = None,
        *,
        with_events: bool = True,
        with_env: bool = True,
        newest: bool = False,
        before: int | None = None,
        after: int | None = None,
        array: int | None = None,
    ) -> list[Job]:
        """Jobs matching every given filter, ordered by id (the first ``limit``; the
        last ``limit``, newest first, with ``newest``), only ids below ``before`` and
        above ``after`` where given (a page's cursor). ``with_events=False`` skips the
        history (the scheduler does not need it); ``with_env=False`` the environments
        (a user's is kilobytes: 10,000 queued jobs' were most of a pass's time and of
        the daemon's memory), each job's ``spec.env`` then ``ENV_NOT_READ``."""
        tail, args = job_queries.listing(
            states, user, group, ids, limit, newest=newest, before=before, after=after, array=array
        )
        sql = f"SELECT {'*' if with_env else self._columns_but_env()} FROM jobs{tail}"
        with self._tx(write=False) as conn:
            listed = job_queries.list_rows(conn, sql, args, with_events=with_events)
        return job_queries.jobs_of(listed)

    def peaks(
        self, uid: int, *, key: str | None = None, name: str | None = None, limit: int = 5
    ) -> builtins.list[int]:
        """What the allocations of this user's latest succeeded jobs with this key (else
        name) peaked at, newest first: the cap hook's report, else the driver's peak less
        the CUDA context booked beside the budget. What ``--mem auto`` learns from."""
        return [int(v) for v in self._succeeded(uid, key, name, limit, learned.PEAK)]

    def runtimes(
        self, uid: int, *, key: str | None = None, name: str | None = None, limit: int = 5
    ) -> builtins.list[float]:
        """Run times (start of the last attempt to its end) of this user's latest succeeded
        jobs with this key (else name), newest first: what backfill's estimates learn from."""
        return [float(v) for v in self._succeeded(uid, key, name, limit, learned.RUNTIME)]

    def _succeeded(
        self, uid: int, key: str | None, name: str | None, limit: int, figure: learned.Figure
    ) -> builtins.list[Any]:
        same = learned.same_job(key, name)
        if same is None:
            return []
        with self._tx(write=False) as conn:
            return learned.succeeded(conn, uid, same, limit, figure)

    def recent_ends(self, uid: int, group: str, limit: int = 3) -> builtins.list[Job]:
        """This user's latest ended jobs of ``group``, newest first (with events)."""
        with self._tx(write=False) as conn:
            ids = learned.recent_end_ids(conn, uid, group, limit)
        return sorted(self.list(ids=ids), key=lambda j: (-(j.ended_at or 0), -j.id))

    def group_released_since(self, uid: int, group: str, since: float) -> bool:
        """Was one of this user's jobs of ``group`` released (``release``) at or after
        ``since``? A release after a failure streak lets the group run again."""
        with self._tx(write=False) as conn:
            return learned.group_released_since(conn, uid, group, since)

    def active(self) -> builtins.list[Job]:
        """Jobs that hold GPU budget: reserved and running."""
        return self.list(states=sorted(ACTIVE))

    def counts(self) -> dict[str, int]:
        """Number of jobs per state (every state present, zero included)."""
        with self._tx(write=False) as conn:
            return job_queries.counts(conn)

    def stats(self, now: float) -> dict[str, Any]:
        """What the daemon's /metrics reports about the queue, in one read: jobs per
        (state, qos), OOM retries and preemptions so far, leak events, the oldest queued
        job's wait, and the raw samples for the wait and release-time histograms."""
        with self._tx(write=False) as conn:
            return job_queries.stats(conn, now)

    def samples(
        self, since: float, until: float | None = None, *, job_id: int | None = None
    ) -> builtins.list[GpuSample]:
        """Memory samples from ``since`` (to ``until``), oldest first; only those in
        which ``job_id`` held memory when it is given."""
        sql, args = measurements.samples_query(since, until, job_id)
        with self._tx(write=False) as conn:
            rows = conn.execute(sql, args).fetchall()
        return measurements.read_samples(rows)

    # -- writing -------------------------------------------------------------------

    def record_samples(self, samples: Iterable[GpuSample], *, keep: float, now: float) -> None:
        """Store one pass's samples and drop those older than ``keep`` seconds."""
        with self._tx(write=True) as conn:
            measurements.record_samples(conn, samples, keep=keep, now=now)

    def add_context_sample(self, model: str, driver: str, nbytes: int, now: float) -> None:
        """Keep one measurement of the CUDA context on a GPU model and driver (the
        latest ``SAMPLES_KEPT`` of each are kept)."""
        with self._tx(write=True) as conn:
            measurements.add_context_sample(conn, model, driver, nbytes, now)

    def context_samples(self) -> dict[tuple[str, str], builtins.list[int]]:
        """Every kept CUDA context measurement, oldest first, by (GPU model, driver)."""
        with self._tx(write=False) as conn:
            return measurements.context_samples(conn)

    def submit(
        self,
        spec: JobSpec,
        now: float,
        *,
        state: str = QUEUED,
        reason: str | None = None,
        array: Array | None = None,
    ) -> tuple[Job, bool]:
        """Store a new job (``queued``, or ``held``/``infeasible`` decided at submit
        time) with its ``submitted`` event; with ``array``, one such job a task, in one
        transaction, the first task's id the array's. Returns (job, created), the job
        the first task: when ``spec.key`` names this user's job that is queued, held,
        reserved, running or succeeded, that job comes back with created=False and
        nothing is written. Raises DependencyNotFound when ``after`` names a job that
        does not exist."""
        check_spec(spec)
        if state not in lifecycle.SUBMITTED_AS:
            raise ValueError(f"a job cannot be submitted as {state}")
        with self._tx(write=True) as conn:
            return job_changes.submit(conn, spec, now, state, reason, array)

    def resolve(self, refs: Sequence[Ref]) -> tuple[builtins.list[int], builtins.list[Ref]]:
        """The job ids that references name (jobs/arrays.py): an id names its job, or
        every task when it is an array's id; ``(array, index)`` one task. Returns the
        ids, sorted, and the references that name nothing, in their order, once each."""
        with self._tx(write=False) as conn:
            return job_queries.resolve(conn, refs)

    def ids_above(self, floor: int) -> int | None:
        """Make every job id issued from now on exceed ``floor`` (the highest job
        directory on disk), so a reset database cannot hand out an id whose directory
        and logs belong to an earlier job. Returns the highest id this database had
        issued when that was below ``floor`` (it was made anew or reset), else None."""
        with self._tx(write=True) as conn:
            return job_changes.ids_above(conn, floor)

    def transition(
        self,
        job_id: int,
        from_states: str | Iterable[str],
        to_state: str | None,
        *,
        now: float,
        kind: str,
        detail: str | None = None,
        hold: NewHold | None = None,
        **fields: object,
    ) -> Job:
        """Compare-and-set: move the job to ``to_state`` (None: keep the state it is in)
        only if it is in one of ``from_states``, set ``fields`` (see
        job_changes.TRANSITION_FIELDS; those not given keep their value) and append the
        event — one transaction. ``hold``: the ended attempt's memory stays reserved
        until verified back (written in the same transaction). Raises Conflict when the
        job is in another state (another actor moved it first), JobNotFound when it does
        not exist. Returns the job as committed."""
        plan = job_changes.plan_transition(job_id, from_states, to_state, kind, fields)
        with self._tx(write=True) as conn:
            current, job = job_changes.transition(
                conn, job_id, plan, now=now, kind=kind, detail=detail, hold=hold
            )
        if job.state in TERMINAL and current not in TERMINAL:
            self._ended(job)
        return job

    def _ended(self, job: Job) -> None:
        """Tell ``on_end`` (the daemon's notifications) of a job's end, after its commit;
        whatever it does wrong is logged, never the transition's failure."""
        if self.on_end is None:
            return
        try:
            self.on_end(job)
        except Exception:
            logging.getLogger("gpuwarden.store").exception("on_end of job %d", job.id)

    # -- memory holds ----------------------------------------------------------------

    def open_holds(self) -> builtins.list[Hold]:
        """Memory of ended attempts not yet verified back (or cleared), oldest first."""
        with self._tx(write=False) as conn:
            return holds.open_holds(conn)

    def close_hold(self, hold_id: int, now: float, how: str, *, kind: str, detail: str) -> bool:
        """Release a hold (memory verified back, or cleared) and note it on its job.
        False when it was closed already."""
        lifecycle.check_note(kind)
        with self._tx(write=True) as conn:
            return holds.close_hold(conn, hold_id, now, how, kind=kind, detail=detail)

    def report_leak(self, hold_id: int, what: str, now: float) -> bool:
        """Record, once, what an open hold found still there (a ``leak`` event)."""
        with self._tx(write=True) as conn:
            return holds.report_leak(conn, hold_id, what, now)

    def add_event(self, job_id: int, kind: str, detail: str | None, now: float) -> Event:
        """Append an event that changes no state (a note: oom seen, leak found)."""
        lifecycle.check_note(kind)
        if not ints_ok(job_id):
            raise JobNotFound(job_id)
        with self._tx(write=True) as conn:
            return events.add_note(conn, job_id, kind, detail, now)

    def set_allocated_peak(self, job_id: int, nbytes: int) -> None:
        """What the job's allocator peaked at, as its cap hook reported when it ended."""
        if not ints_ok(job_id, nbytes):
            raise ValueError("allocated peak out of range")
        with self._tx(write=True) as conn:
            job_changes.set_allocated_peak(conn, job_id, nbytes)

    def set_peak(self, job_id: int, nbytes: int) -> bool:
        """Raise the recorded peak memory to ``nbytes`` if higher (it only grows).
        Returns whether it changed. No event: the sampler calls this every pass."""
        if not ints_ok(job_id, nbytes):
            raise ValueError("peak memory out of range")
        with self._tx(write=True) as conn:
            return job_changes.set_peak(conn, job_id, nbytes)

    def set_reason(self, job_id: int, reason: str | None, now: float | None = None) -> bool:
        """Say why a queued or held job waits. Writes (and appends a ``waiting`` event
        when ``now`` is given) only when the reason changed, so a scheduler pass that
        finds the same reason writes nothing. Returns whether it changed; False also
        when the job is no longer waiting or no longer exists (the scheduler's view
        may be a pass old)."""
        if not ints_ok(job_id):
            return False
        with self._tx(write=True) as conn:
            return job_changes.set_reason(conn, job_id, reason, now)

    def usage_spans(self, since: float) -> builtins.list[Span]:
        """The memory jobs held since ``since`` (fair share, sched/fairshare.py): each
        running job's budget over its GPUs from its start, and each ended job's from its
        last attempt's start to its end."""
        with self._tx(write=False) as conn:
            return learned.usage_spans(conn, since)

    def set_reasons(self, reasons: dict[int, str]) -> None:
        """``set_reason`` for many jobs in one transaction (an array's throttled tasks,
        thousands at a time), with no events."""
        kept = {job_id: why for job_id, why in reasons.items() if ints_ok(job_id)}
        if not kept:
            return
        with self._tx(write=True) as conn:
            job_changes.set_reasons(conn, kept)

    def delete(self, job_id: int) -> Job:
        """Remove a finished job and its events; returns it (so its directory can go
        too). Conflict when it is not finished or an unfinished job depends on it."""
        if not ints_ok(job_id):
            raise JobNotFound(job_id)
        with self._tx(write=True) as conn:
            return maintenance.delete(conn, job_id)

    def clean(self, older_than_seconds: float, now: float, *, user: str | None = None) -> int:
        """Remove finished jobs (of ``user``, if given) that ended more than
        ``older_than_seconds`` before ``now``, except those an unfinished job depends
        on. Returns how many were removed."""
        with self._tx(write=True) as conn:
            return maintenance.clean(conn, older_than_seconds, now, user=user)

    # -- checking ------------------------------------------------------------------

    def integrity(self) -> str:
        """SQLite's own check of the file: ``ok`` when sound."""
        with self._tx(write=False) as conn:
            return maintenance.integrity(conn)

    def audit(self) -> builtins.list[str]:
        """Problems where the jobs and their events disagree; empty when none.
        Each job's transition events must form a chain from its submission to its
        current state: every state change has its event and every transition event
        its state change."""
        with self._tx(write=False) as conn:
            jobs, chains, problems = events.read_chains(conn)
        return problems + events.chain_problems(jobs, chains)

    def transitions(self, job_id: int) -> builtins.list[tuple[str | None, str]]:
        """The (from, to) states of a job's submission and transitions, in order."""
        with self._tx(write=False) as conn:
            return events.transitions(conn, job_id)

    def edit(
        self,
        job_id: int,
        from_states: Iterable[str],
        changes: dict[str, Any],
        *,
        now: float,
        detail: str,
    ) -> Job:
        """Change a waiting job's request (``gpuwarden edit``): ``changes`` maps JobSpec
        fields (see job_changes.EDIT_COLUMNS) to their new values, written with an
        ``edited`` event in one transaction, only while the job is in one of
        ``from_states`` (else Conflict). A new ``mem`` is the budget from then on, also
        after an OOM retry raised it."""
        froms = job_changes.check_edit(from_states, changes)
        with self._tx(write=True) as conn:
            return job_changes.edit(conn, job_id, froms, changes, now=now, detail=detail)

    # -- drained GPUs ------------------------------------------------------------------
    def drain(self, gpu: int, reason: str | None, by: str, now: float) -> bool:
        """Mark GPU ``gpu`` drained (no new placement there); False when it was already
        (its reason and who drained it are then updated)."""
        with self._tx(write=True) as conn:
            return drains.drain(conn, gpu, reason, by, now)

    def undrain(self, gpu: int) -> bool:
        """Let placement use GPU ``gpu`` again; False when it was not drained."""
        with self._tx(write=True) as conn:
            return drains.undrain(conn, gpu)

    def drains(self) -> dict[int, dict[str, Any]]:
        """GPU index -> {reason, by, at} of every drained GPU."""
        with self._tx(write=False) as conn:
            return drains.drains(conn)
