"""The daemon's state: jobs and their event history in one SQLite database.

Invariant 2 lives here: a job is in exactly one state (one ``state`` column), and every
change of state is one transaction that moves the job *and* appends the event that
records it, committed before the caller acts on it (reserve, commit, then launch).
Invariant 3 follows: a killed daemon leaves the database at its last commit, so no job
is lost and, with compare-and-set transitions, no job is started twice.

Decisions, and why:

* WAL journal: readers never block the writer and a crash leaves the database at the
  last commit.
* ``synchronous=FULL`` (the default here): each commit fsyncs the WAL, so a transition
  survives a power loss or kernel crash too, not just a daemon crash. With ``NORMAL``
  the last commits could roll back after a power loss while the world already saw their
  action (a job started, a job finished and wrote results), and after reboot the job
  would run again: exactly the duplicate invariant 3 forbids. The price is one fsync
  per transition (around a millisecond on an SSD), far under the 30 ms submit→start
  goal. ``NORMAL`` is still accepted for throwaway stores (benchmarks, property tests).
* Threads: one shared connection (``check_same_thread=False``) behind a lock, not one
  connection per thread. SQLite admits one writer at a time anyway, so per-thread
  connections would only trade our lock for SQLite's busy handler (sleep and retry,
  with latency spikes and ``database is locked`` under load); a thread pool that
  churns threads would also leak connections. Behind the lock each call is short, sees
  every earlier commit, and never waits on itself. Other *processes* (the CLI in tests,
  a second daemon that lost the lock race) are handled by ``BEGIN IMMEDIATE`` plus a
  busy timeout: the write lock is taken before the compare in compare-and-set.
  After ``fork`` the child opens its own connection (SQLite connections must not
  cross a fork).

The tables, and how an older file is brought up to date: ``daemon/schema.py``; rows to
the model's values and back: ``daemon/rows.py``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.daemon.rows import (
    check_spec,
    field_value,
    hold_columns,
    ints_ok,
    json_ids,
    keep_attempt_use,
    row_to_hold,
    row_to_job,
    spec_columns,
    states_arg,
)
from gpuwarden.daemon.schema import KEY_RELEASED as KEY_RELEASED
from gpuwarden.daemon.schema import MIGRATIONS as MIGRATIONS
from gpuwarden.daemon.schema import RELEASED_SQL, Migration, migrate
from gpuwarden.daemon.schema import SCHEMA_VERSION as SCHEMA_VERSION
from gpuwarden.daemon.store_errors import Conflict as Conflict
from gpuwarden.daemon.store_errors import DependencyNotFound as DependencyNotFound
from gpuwarden.daemon.store_errors import JobNotFound as JobNotFound
from gpuwarden.daemon.store_errors import SchemaTooNew as SchemaTooNew
from gpuwarden.daemon.store_errors import StoreError as StoreError
from gpuwarden.jobs import lifecycle
from gpuwarden.jobs.arrays import Array, Ref
from gpuwarden.jobs.model import (
    ACTIVE,
    HELD,
    QUEUED,
    RESERVED,
    RUNNING,
    STATES,
    SUCCEEDED,
    TERMINAL,
    Event,
    Hold,
    Job,
    JobSpec,
    NewHold,
)
from gpuwarden.sched.fairshare import Span

if TYPE_CHECKING:
    from gpuwarden.daemon.history import GpuSample

# Columns a transition may set (rows.field_value: how each is stored).
TRANSITION_FIELDS = frozenset({
    "started_at", "ended_at", "gpus", "gpu_uuids", "budget", "exit_code", "reason",
    "supervisor_pid", "supervisor_start", "boot_id", "attempts", "peak_memory",
    "preempting_at", "preemptions", "oom_retries", "retry_mem", "retry_ceiling", "ceiling_until",
    "not_before",
    "kill_reason",
    "cpu_set", "oom_tried", "oom_need", "context",
    "restarts", "health_failures",  # a service's
})
_WAITING = (QUEUED, HELD)
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(TERMINAL))
# Ids that a job not yet finished still waits for: they cannot be removed.
_NEEDED_SQL = " UNION ".join(  # --after, --after-any, --after-fail
    f"SELECT d.value FROM jobs AS w, json_each(w.{column}) AS d "
    f"WHERE w.state NOT IN ({_TERMINAL_SQL})"
    for column in ("after_ids", "after_any_ids", "after_fail_ids"))
# What ``edit`` may change in a waiting job: JobSpec field -> column.
_EDIT_COLUMNS = {"mem": "mem", "mem_limit": "mem_limit", "priority": "priority",
                 "qos": "qos", "gpus": "gpu_count", "timeout": "timeout", "name": "name"}

class Store:
    """Jobs and events in SQLite. Every method is one transaction; every mutation that
    changes a job's state appends its event in the same transaction. Thread-safe (one
    connection behind a lock); several processes may open the same file."""

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL",
                 busy_timeout: float = 10.0,
                 migrations: Sequence[Migration] | None = None) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be FULL or NORMAL")
        self.path = Path(path)
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._migrations = list(MIGRATIONS if migrations is None else migrations)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.on_end: Callable[[Job], None] | None = None  # after a job's final transition
        self._light_columns: str | None = None  # the listing without environments
        self._create_file()
        self._conn: sqlite3.Connection | None = None
        self._conn = self._open()

    # -- connection ----------------------------------------------------------------

    def _create_file(self) -> None:
        """Create the database owner-only (it holds job environments), and only create
        it: closing a descriptor of a file this process has open in SQLite drops every
        POSIX lock the process holds on it (the daemon opens two stores), and the next
        process to close a connection would delete the WAL under the daemon's writes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return
        except OSError as e:
            raise StoreError(f"cannot open state database {self.path}: "
                             f"{e.strerror or e}") from None
        os.close(fd)

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout,
                                   isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open state database {self.path}: {e}") from None
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"state database {self.path} cannot use WAL mode "
                                 f"(got {mode}); is it on a network filesystem?")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn, self._migrations, self.path)
        except sqlite3.DatabaseError as e:
            conn.close()
            raise StoreError(f"state database {self.path} is unusable: {e}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held by a thread
        that does not exist here) and a fresh connection (SQLite's must not cross a
        fork; the inherited one is left alone, not closed, so the parent's locks hold)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._conn = self._open()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("the state store is closed")
        return self._conn

    @contextmanager
    def _tx(self, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction under the lock. Writes take the write lock up front
        (``BEGIN IMMEDIATE``) so a compare-and-set cannot interleave with another
        process; reads are one snapshot, so a job and its events agree."""
        if os.getpid() != self._pid:
            self._after_fork()
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.OperationalError as e:
                raise StoreError(f"state database {self.path}: {e}") from None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                self._roll_back(conn)
                # Locked too long, disk full, I/O error, corrupt file: the database's
                # trouble, not a bug here (integrity and programming errors stay as they are).
                if type(e) in (sqlite3.OperationalError, sqlite3.DatabaseError):
                    raise StoreError(f"state database {self.path}: {e}") from None
                raise

    def _roll_back(self, conn: sqlite3.Connection) -> None:
        """End a failed transaction. If even that fails (the disk is full, the file is
        gone), the connection is replaced, so one bad moment cannot leave every later
        transaction failing with "cannot start a transaction within a transaction"."""
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            self._conn = None
            with contextlib.suppress(StoreError):
                self._conn = self._open()

    def close(self) -> None:
        if os.getpid() != self._pid:  # a forked child never opened one of its own
            self._conn = None
            return
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------

    @staticmethod
    def _events(conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, list[Event]]:
        out: dict[int, list[Event]] = {i: [] for i in ids}
        if not ids:
            return out
        if len(ids) == 1:
            rows = conn.execute(
                "SELECT job_id, at, kind, detail FROM events WHERE job_id = ? ORDER BY id",
                (ids[0],))
        else:
            rows = conn.execute(
                "SELECT job_id, at, kind, detail FROM events WHERE job_id IN "
                "(SELECT value FROM json_each(?)) ORDER BY id", (json_ids(ids),))
        for r in rows:
            out[r["job_id"]].append(Event(at=r["at"], kind=r["kind"], detail=r["detail"]))
        return out

    @staticmethod
    def _holds(conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, Hold]:
        """The latest hold of each job that has one."""
        if not ids:
            return {}
        rows = conn.execute(
            "SELECT * FROM holds WHERE id IN (SELECT max(id) FROM holds WHERE job_id IN "
            "(SELECT value FROM json_each(?)) GROUP BY job_id)", (json_ids(ids),))
        return {r["job_id"]: row_to_hold(r) for r in rows}

    def _columns_but_env(self) -> str:
        """The jobs table's columns, env read as NULL (it is NOT NULL in the table, so
        NULL says: not read)."""
        if self._light_columns is None:
            with self._tx(write=False) as conn:
                names = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
            self._light_columns = ", ".join("NULL AS env" if n == "env" else f'"{n}"'
                                            for n in names)
        return self._light_columns

    def _load(self, conn: sqlite3.Connection, job_id: int) -> Job:
        row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return row_to_job(row, self._events(conn, [job_id])[job_id],
                          self._holds(conn, [job_id]).get(job_id))

    def get(self, job_id: int) -> Job:
        """The job with its events (oldest first); JobNotFound when there is none."""
        if not ints_ok(job_id):
            raise JobNotFound(job_id)
        with self._tx(write=False) as conn:
            return self._load(conn, job_id)

    def list(self, states: Iterable[str] | None = None, user: str | None = None,
             group: str | None = None, ids: Iterable[int] | None = None,
             limit: int | None = None, *, with_events: bool = True,
             with_env: bool = True, newest: bool = False, before: int | None = None,
             after: int | None = None, array: int | None = None) -> list[Job]:
        """Jobs matching every given filter, ordered by id (the first ``limit``; the
        last ``limit``, newest first, with ``newest``), only ids below ``before`` and
        above ``after`` where given (a page's cursor). ``with_events=False`` skips the
        history (the scheduler does not need it); ``with_env=False`` the environments
        (a user's is kilobytes: 10,000 queued jobs' were most of a pass's time and of
        the daemon's memory), each job's ``spec.env`` then ``ENV_NOT_READ``."""
        where: list[str] = []
        args: list[Any] = []
        for bound, op in ((before, "<"), (after, ">")):
            if bound is not None:
                where.append(f"id {op} ?")
                args.append(bound)
        if states is not None:
            where.append("state IN (SELECT value FROM json_each(?))")
            args.append(json.dumps(list(states_arg(states))))
        if user is not None:
            where.append("user = ?")
            args.append(user)
        if group is not None:
            where.append("job_group = ?")
            args.append(group)
        if ids is not None:
            id_list = [i for i in ids if ints_ok(i)]
            where.append("id IN (SELECT value FROM json_each(?))")
            args.append(json_ids(id_list))
        if array is not None:
            where.append("array_id = ?")
            args.append(array if ints_ok(array) else -1)
        sql = f"SELECT {'*' if with_env else self._columns_but_env()} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC" if newest else " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(max(0, limit))
        with self._tx(write=False) as conn:
            rows = conn.execute(sql, args).fetchall()
            ids = [r["id"] for r in rows]
            events = self._events(conn, ids) if with_events else {}
            holds = self._holds(conn, ids) if with_events else {}
            return [row_to_job(r, events.get(r["id"], ()), holds.get(r["id"])) for r in rows]

    def peaks(self, uid: int, *, key: str | None = None, name: str | None = None,
              limit: int = 5) -> builtins.list[int]:
        """What the allocations of this user's latest succeeded jobs with this key (else
        name) peaked at, newest first: the cap hook's report, else the driver's peak less
        the CUDA context booked beside the budget. What ``--mem auto`` learns from."""
        return [int(v) for v in self._succeeded(
            uid, key, name, limit, "coalesce(allocated_peak, "
            "max(peak_memory - coalesce(context, 0), 0))", "peak_memory IS NOT NULL")]

    def runtimes(self, uid: int, *, key: str | None = None, name: str | None = None,
                 limit: int = 5) -> builtins.list[float]:
        """Run times (start of the last attempt to its end) of this user's latest succeeded
        jobs with this key (else name), newest first: what backfill's estimates learn from."""
        return [float(v) for v in self._succeeded(
            uid, key, name, limit, "ended_at - started_at",
            "started_at IS NOT NULL AND ended_at IS NOT NULL")]

    def _succeeded(self, uid: int, key: str | None, name: str | None, limit: int,
                   value_sql: str, known_sql: str) -> builtins.list[Any]:
        """One figure (``value_sql``, where ``known_sql`` holds) of this user's latest
        succeeded jobs with this key, else this name, newest first."""
        if key is not None:
            where, arg = "job_key = ?", key
        elif name is not None:
            where, arg = "name = ?", name
        else:
            return []
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {value_sql} FROM jobs WHERE uid = ? AND {where} AND state = ? "
                f"AND {known_sql} ORDER BY ended_at DESC, id DESC LIMIT ?",
                (uid, arg, SUCCEEDED, limit))
            return [r[0] for r in rows]

    def recent_ends(self, uid: int, group: str, limit: int = 3) -> builtins.list[Job]:
        """This user's latest ended jobs of ``group``, newest first (with events)."""
        with self._tx(write=False) as conn:
            ids = [r[0] for r in conn.execute(
                f"SELECT id FROM jobs WHERE uid = ? AND job_group = ? AND state IN "
                f"({_TERMINAL_SQL}) ORDER BY ended_at DESC, id DESC LIMIT ?",
                (uid, group, limit))]
        return sorted(self.list(ids=ids), key=lambda j: (-(j.ended_at or 0), -j.id))

    def group_released_since(self, uid: int, group: str, since: float) -> bool:
        """Was one of this user's jobs of ``group`` released (``release``) at or after
        ``since``? A release after a failure streak lets the group run again."""
        with self._tx(write=False) as conn:
            row = conn.execute(
                "SELECT 1 FROM events e JOIN jobs j ON j.id = e.job_id WHERE j.uid = ? AND "
                "j.job_group = ? AND e.kind = 'released' AND e.at >= ? LIMIT 1",
                (uid, group, since)).fetchone()
        return row is not None

    def active(self) -> builtins.list[Job]:
        """Jobs that hold GPU budget: reserved and running."""
        return self.list(states=sorted(ACTIVE))

    def counts(self) -> dict[str, int]:
        """Number of jobs per state (every state present, zero included)."""
        with self._tx(write=False) as conn:
            rows = conn.execute("SELECT state, count(*) FROM jobs GROUP BY state")
            found = {r[0]: r[1] for r in rows}
        return {s: found.get(s, 0) for s in STATES} | {
            s: n for s, n in found.items() if s not in STATES}

    def stats(self, now: float) -> dict[str, Any]:
        """What the daemon's /metrics reports about the queue, in one read: jobs per
        (state, qos), OOM retries and preemptions so far, leak events, the oldest queued
        job's wait, and the raw samples for the wait and release-time histograms."""
        with self._tx(write=False) as conn:
            by = {(r[0], r[1]): r[2] for r in conn.execute(
                "SELECT state, qos, count(*) FROM jobs GROUP BY state, qos")}
            totals = conn.execute(
                "SELECT coalesce(sum(oom_retries), 0), coalesce(sum(preemptions), 0) "
                "FROM jobs").fetchone()
            leaks = conn.execute("SELECT count(*) FROM events WHERE kind = 'leak'"
                                 ).fetchone()[0]
            oldest = conn.execute("SELECT min(submitted_at) FROM jobs WHERE state = ?",
                                  (QUEUED,)).fetchone()[0]
            waits = [r[0] for r in conn.execute(
                "SELECT started_at - submitted_at FROM jobs WHERE started_at IS NOT NULL")]
            releases = [r[0] for r in conn.execute(
                "SELECT released_at - exited_at FROM holds WHERE how = 'verified'")]
            # Services not ended, or ended within a day: their restart counters.
            services = [(r[0], r[1], r[2], r[3]) for r in conn.execute(
                "SELECT id, user, restarts, health_failures FROM jobs WHERE service IS NOT "
                "NULL AND (ended_at IS NULL OR ended_at > ?) ORDER BY id", (now - 86400,))]
        return {"jobs": by, "oom_retries": totals[0], "preemptions": totals[1],
                "leaks": leaks, "oldest_wait": None if oldest is None else now - oldest,
                "waits": waits, "releases": releases, "services": services}

    def samples(self, since: float, until: float | None = None, *,
                job_id: int | None = None) -> builtins.list[GpuSample]:
        """Memory samples from ``since`` (to ``until``), oldest first; only those in
        which ``job_id`` held memory when it is given."""
        from gpuwarden.daemon.history import GpuSample

        sql = "SELECT ts, gpu, idx, total, used, leaked, parts FROM samples WHERE ts >= ?"
        args: builtins.list[Any] = [int(since)]
        if until is not None:
            sql += " AND ts <= ?"
            args.append(int(until))
        if job_id is not None:
            sql += " AND json_extract(parts, ?) IS NOT NULL"
            args.append(f'$.j."{int(job_id)}"')
        with self._tx(write=False) as conn:
            rows = conn.execute(sql + " ORDER BY ts, idx", args).fetchall()
        return [GpuSample.from_row(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]))
                for r in rows]

    # -- writing -------------------------------------------------------------------

    def record_samples(self, samples: Iterable[GpuSample], *, keep: float,
                       now: float) -> None:
        """Store one pass's samples and drop those older than ``keep`` seconds."""
        with self._tx(write=True) as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO samples (gpu, ts, idx, total, used, leaked, parts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(s.uuid, s.ts, s.index, s.total, s.used, s.leaked,
                  json.dumps(s.parts(), separators=(",", ":"))) for s in samples])
            conn.execute("DELETE FROM samples WHERE ts < ?", (int(now - keep),))

    def add_context_sample(self, model: str, driver: str, nbytes: int, now: float) -> None:
        """Keep one measurement of the CUDA context on a GPU model and driver (the
        latest ``SAMPLES_KEPT`` of each are kept)."""
        from gpuwarden.sched.context import SAMPLES_KEPT

        with self._tx(write=True) as conn:
            conn.execute("INSERT INTO contexts (model, driver, at, bytes) VALUES (?, ?, ?, ?)",
                         (model, driver, now, int(nbytes)))
            conn.execute("DELETE FROM contexts WHERE model = ? AND driver = ? AND rowid NOT IN "
                         "(SELECT rowid FROM contexts WHERE model = ? AND driver = ? "
                         "ORDER BY at DESC LIMIT ?)", (model, driver, model, driver,
                                                      SAMPLES_KEPT))

    def context_samples(self) -> dict[tuple[str, str], builtins.list[int]]:
        """Every kept CUDA context measurement, oldest first, by (GPU model, driver)."""
        with self._tx(write=False) as conn:
            rows = conn.execute("SELECT model, driver, bytes FROM contexts ORDER BY at")
            out: dict[tuple[str, str], builtins.list[int]] = {}
            for model, driver, nbytes in rows:
                out.setdefault((str(model), str(driver)), []).append(int(nbytes))
            return out

    def submit(self, spec: JobSpec, now: float, *, state: str = QUEUED,
               reason: str | None = None, array: Array | None = None) -> tuple[Job, bool]:
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
            if spec.key is not None:
                row = conn.execute(
                    "SELECT id FROM jobs WHERE uid = ? AND job_key = ? AND state NOT IN "
                    f"({RELEASED_SQL})", (spec.uid, spec.key)).fetchone()
                if row is not None:
                    return self._load(conn, row["id"]), False
            deps = (*spec.after, *spec.after_any, *spec.after_fail)
            if deps:
                wanted = sorted(set(deps))
                found = {r[0] for r in conn.execute(
                    "SELECT id FROM jobs WHERE id IN (SELECT value FROM json_each(?))",
                    (json_ids(wanted),))}
                missing = [i for i in wanted if i not in found]
                if missing:
                    raise DependencyNotFound(missing)
            if array is None:
                return self._load(conn, self._insert(conn, spec, now, state, reason)), True
            first: int | None = None
            for index in array.indices:
                job_id = self._insert(conn, spec, now, state, reason)
                first = job_id if first is None else first
                conn.execute("UPDATE jobs SET array_id = ?, array_index = ?, array_limit = ? "
                             "WHERE id = ?", (first, index, array.limit, job_id))
            assert first is not None
            return self._load(conn, first), True

    @staticmethod
    def _insert(conn: sqlite3.Connection, spec: JobSpec, now: float, state: str,
                reason: str | None) -> int:
        columns = {**spec_columns(spec), "state": state, "submitted_at": now, "reason": reason}
        cur = conn.execute(f"INSERT INTO jobs ({', '.join(columns)}) "
                           f"VALUES ({', '.join('?' * len(columns))})", list(columns.values()))
        job_id = cur.lastrowid
        assert job_id is not None
        conn.execute(
            "INSERT INTO events (job_id, at, kind, detail, from_state, to_state) "
            "VALUES (?, ?, 'submitted', ?, NULL, ?)",
            (job_id, now, reason if state != QUEUED else None, state))
        return job_id

    def resolve(self, refs: Sequence[Ref]) -> tuple[builtins.list[int], builtins.list[Ref]]:
        """The job ids that references name (jobs/arrays.py): an id names its job, or
        every task when it is an array's id; ``(array, index)`` one task. Returns the
        ids, sorted, and the references that name nothing, in their order, once each."""
        plain = sorted({r for r in refs if isinstance(r, int) and ints_ok(r)})
        found: set[int] = set()
        named: set[Ref] = set()
        with self._tx(write=False) as conn:
            for row in conn.execute(
                    "SELECT id, array_id FROM jobs WHERE id IN (SELECT value FROM json_each(?))"
                    " OR array_id IN (SELECT value FROM json_each(?))",
                    (json_ids(plain), json_ids(plain))):
                found.add(row["id"])
                named.update(i for i in (row["id"], row["array_id"]) if i is not None)
            for ref in {r for r in refs if isinstance(r, tuple) and ints_ok(*r)}:
                row = conn.execute("SELECT id FROM jobs WHERE array_id = ? AND array_index = ?",
                                   ref).fetchone()
                if row is not None:
                    found.add(row["id"])
                    named.add(ref)
        return sorted(found), list(dict.fromkeys(r for r in refs if r not in named))

    def ids_above(self, floor: int) -> int | None:
        """Make every job id issued from now on exceed ``floor`` (the highest job
        directory on disk), so a reset database cannot hand out an id whose directory
        and logs belong to an earlier job. Returns the highest id this database had
        issued when that was below ``floor`` (it was made anew or reset), else None."""
        with self._tx(write=True) as conn:
            row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'"
                               ).fetchone()
            top = conn.execute("SELECT coalesce(max(id), 0) FROM jobs").fetchone()[0]
            issued = max(int(top), 0 if row is None else int(row[0]))
            if issued >= floor:
                return None
            if row is None:
                conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)",
                             (floor,))
            else:
                conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs'",
                             (floor,))
            return issued

    def transition(self, job_id: int, from_states: str | Iterable[str],
                   to_state: str | None, *, now: float, kind: str, detail: str | None = None,
                   hold: NewHold | None = None, **fields: object) -> Job:
        """Compare-and-set: move the job to ``to_state`` (None: keep the state it is in)
        only if it is in one of ``from_states``, set ``fields`` (see TRANSITION_FIELDS;
        those not given keep their value) and append the event — one transaction.
        ``hold``: the ended attempt's memory stays reserved until verified back (written
        in the same transaction). Raises Conflict when the job is in another state
        (another actor moved it first), JobNotFound when it does not exist. Returns the
        job as committed."""
        froms = states_arg(from_states)
        if to_state is not None and to_state not in STATES:
            raise ValueError(f"unknown job state: {to_state}")
        lifecycle.check(kind, froms, to_state)
        unknown = set(fields) - TRANSITION_FIELDS
        if unknown:
            raise TypeError(f"transition() cannot set {', '.join(sorted(unknown))}")
        sets = ["state = ?"]
        args: list[Any] = [to_state]  # None is filled in once the current state is read
        for name, value in sorted(fields.items()):
            sets.append(f"{name} = ?")
            args.append(field_value(name, value))
        if not ints_ok(job_id):
            raise JobNotFound(job_id)
        with self._tx(write=True) as conn:
            row = conn.execute("SELECT state, attempts, started_at, ended_at, gpus, budget, "
                               "peak_memory FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(job_id)
            current = row["state"]
            if current not in froms:
                raise Conflict(f"job {job_id} is {current}, not {'/'.join(froms)}",
                               job_id=job_id, state=current)
            if to_state is None:
                to_state = args[0] = current
            if "started_at" in fields and fields["started_at"] is None \
                    and row["started_at"] is not None:  # an attempt's figures are cleared
                sets, args = keep_attempt_use(row, current, now, sets, args)
            try:
                conn.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ? AND state = ?",
                             [*args, job_id, current])
            except sqlite3.IntegrityError:  # the live-key index: retry while key in use
                raise Conflict(f"job {job_id} cannot become {to_state}: another job of "
                               "this user holds its key", job_id=job_id,
                               state=current) from None
            conn.execute(
                "INSERT INTO events (job_id, at, kind, detail, from_state, to_state) "
                "VALUES (?, ?, ?, ?, ?, ?)", (job_id, now, kind, detail, current, to_state))
            if hold is not None and hold.gpu_uuids:
                columns = {"job_id": job_id, "attempt": row["attempts"],
                           **hold_columns(hold)}
                conn.execute(f"INSERT INTO holds ({', '.join(columns)}) "
                             f"VALUES ({', '.join('?' * len(columns))})",
                             list(columns.values()))
            job = self._load(conn, job_id)
        if to_state in TERMINAL and current not in TERMINAL:
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
            return [row_to_hold(r) for r in conn.execute(
                "SELECT * FROM holds WHERE released_at IS NULL ORDER BY id")]

    def close_hold(self, hold_id: int, now: float, how: str, *, kind: str,
                   detail: str) -> bool:
        """Release a hold (memory verified back, or cleared) and note it on its job.
        False when it was closed already."""
        lifecycle.check_note(kind)
        with self._tx(write=True) as conn:
            row = conn.execute("SELECT job_id FROM holds WHERE id = ? AND released_at IS "
                               "NULL", (hold_id,)).fetchone()
            if row is None:
                return False
            conn.execute("UPDATE holds SET released_at = ?, how = ? WHERE id = ?",
                         (now, how, hold_id))
            conn.execute("INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                         (row["job_id"], now, kind, detail))
            return True

    def report_leak(self, hold_id: int, what: str, now: float) -> bool:
        """Record, once, what an open hold found still there (a ``leak`` event)."""
        with self._tx(write=True) as conn:
            row = conn.execute("SELECT job_id FROM holds WHERE id = ? AND released_at IS "
                               "NULL AND leak IS NULL", (hold_id,)).fetchone()
            if row is None:
                return False
            conn.execute("UPDATE holds SET leak = ? WHERE id = ?", (what, hold_id))
            conn.execute("INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, "
                         "'leak', ?)", (row["job_id"], now, what))
            return True

    def add_event(self, job_id: int, kind: str, detail: str | None, now: float) -> Event:
        """Append an event that changes no state (a note: oom seen, leak found)."""
        lifecycle.check_note(kind)
        if not ints_ok(job_id):
            raise JobNotFound(job_id)
        with self._tx(write=True) as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                raise JobNotFound(job_id)
            conn.execute("INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                         (job_id, now, kind, detail))
        return Event(at=now, kind=kind, detail=detail)

    def set_allocated_peak(self, job_id: int, nbytes: int) -> None:
        """What the job's allocator peaked at, as its cap hook reported when it ended."""
        if not ints_ok(job_id, nbytes):
            raise ValueError("allocated peak out of range")
        with self._tx(write=True) as conn:
            conn.execute("UPDATE jobs SET allocated_peak = ? WHERE id = ?", (nbytes, job_id))

    def set_peak(self, job_id: int, nbytes: int) -> bool:
        """Raise the recorded peak memory to ``nbytes`` if higher (it only grows).
        Returns whether it changed. No event: the sampler calls this every pass."""
        if not ints_ok(job_id, nbytes):
            raise ValueError("peak memory out of range")
        with self._tx(write=True) as conn:
            cur = conn.execute(
                "UPDATE jobs SET peak_memory = ? WHERE id = ? "
                "AND (peak_memory IS NULL OR peak_memory < ?)", (nbytes, job_id, nbytes))
            if cur.rowcount:
                return True
            if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                raise JobNotFound(job_id)
            return False

    def set_reason(self, job_id: int, reason: str | None, now: float | None = None) -> bool:
        """Say why a queued or held job waits. Writes (and appends a ``waiting`` event
        when ``now`` is given) only when the reason changed, so a scheduler pass that
        finds the same reason writes nothing. Returns whether it changed; False also
        when the job is no longer waiting or no longer exists (the scheduler's view
        may be a pass old)."""
        if not ints_ok(job_id):
            return False
        with self._tx(write=True) as conn:
            cur = conn.execute(
                "UPDATE jobs SET reason = ? WHERE id = ? AND state IN (?, ?) "
                "AND reason IS NOT ?", (reason, job_id, *_WAITING, reason))
            if not cur.rowcount:
                return False
            if now is not None:
                conn.execute(
                    "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, 'waiting', ?)",
                    (job_id, now, reason))
            return True

    def usage_spans(self, since: float) -> builtins.list[Span]:
        """The memory jobs held since ``since`` (fair share, sched/fairshare.py): each
        running job's budget over its GPUs from its start, and each ended job's from its
        last attempt's start to its end."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                "SELECT user, budget, json_array_length(gpus) AS n, started_at, ended_at, "
                "state FROM jobs WHERE started_at IS NOT NULL AND budget IS NOT NULL AND "
                "(state IN (?, ?) OR (ended_at IS NOT NULL AND ended_at >= ?))",
                (RESERVED, RUNNING, since)).fetchall()
        return [Span(r["user"], r["budget"] * max(r["n"], 1), r["started_at"],
                     None if r["state"] in ACTIVE else r["ended_at"]) for r in rows]

    def set_reasons(self, reasons: dict[int, str]) -> None:
        """``set_reason`` for many jobs in one transaction (an array's throttled tasks,
        thousands at a time), with no events."""
        rows = [(why, job_id, *_WAITING, why) for job_id, why in reasons.items()
                if ints_ok(job_id)]
        if not rows:
            return
        with self._tx(write=True) as conn:
            conn.executemany("UPDATE jobs SET reason = ? WHERE id = ? AND state IN (?, ?) "
                             "AND reason IS NOT ?", rows)

    def delete(self, job_id: int) -> Job:
        """Remove a finished job and its events; returns it (so its directory can go
        too). Conflict when it is not finished or an unfinished job depends on it."""
        if not ints_ok(job_id):
            raise JobNotFound(job_id)
        with self._tx(write=True) as conn:
            job = self._load(conn, job_id)
            if not job.terminal:
                raise Conflict(f"job {job_id} is {job.state}; only finished jobs can be "
                               "removed", job_id=job_id, state=job.state)
            if job.release is not None and job.release.open:
                raise Conflict(f"job {job_id} still holds GPU memory that is not verified "
                               "back; it can be removed once it is (or an admin clears it)",
                               job_id=job_id, state=job.state)
            waiting = conn.execute(
                f"SELECT 1 FROM ({_NEEDED_SQL}) WHERE value = ?",
                (job_id,)).fetchone()
            if waiting is not None:
                raise Conflict(f"job {job_id} is a dependency of a job that has not "
                               "finished", job_id=job_id, state=job.state)
            conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            return job

    def clean(self, older_than_seconds: float, now: float, *,
              user: str | None = None) -> int:
        """Remove finished jobs (of ``user``, if given) that ended more than
        ``older_than_seconds`` before ``now``, except those an unfinished job depends
        on. Returns how many were removed."""
        sql = (f"DELETE FROM jobs WHERE state IN ({_TERMINAL_SQL}) "
               f"AND coalesce(ended_at, submitted_at) < ? AND id NOT IN ({_NEEDED_SQL}) "
               "AND id NOT IN (SELECT job_id FROM holds WHERE released_at IS NULL)")
        args: list[Any] = [now - older_than_seconds]
        if user is not None:
            sql += " AND user = ?"
            args.append(user)
        with self._tx(write=True) as conn:
            return conn.execute(sql, args).rowcount

    # -- checking ------------------------------------------------------------------

    def integrity(self) -> str:
        """SQLite's own check of the file: ``ok`` when sound."""
        with self._tx(write=False) as conn:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
        return "\n".join(str(r[0]) for r in rows)

    def audit(self) -> builtins.list[str]:
        """Problems where the jobs and their events disagree; empty when none.
        Each job's transition events must form a chain from its submission to its
        current state: every state change has its event and every transition event
        its state change."""
        problems: builtins.list[str] = []
        with self._tx(write=False) as conn:
            jobs = {r[0]: r[1] for r in conn.execute("SELECT id, state FROM jobs")}
            chains: dict[int, list[tuple[str | None, str]]] = {i: [] for i in jobs}
            for r in conn.execute("SELECT job_id, from_state, to_state FROM events "
                                  "WHERE to_state IS NOT NULL ORDER BY id"):
                if r[0] not in chains:
                    problems.append(f"event for missing job {r[0]}")
                    continue
                chains[r[0]].append((r[1], r[2]))
        for job_id, state in jobs.items():
            if state not in STATES:
                problems.append(f"job {job_id}: unknown state {state!r}")
            chain = chains[job_id]
            if not chain or chain[0][0] is not None:
                problems.append(f"job {job_id}: no submitted event")
                continue
            for (_, prev_to), (frm, to) in itertools.pairwise(chain):
                if frm != prev_to:
                    problems.append(f"job {job_id}: event {frm}->{to} after {prev_to}")
            if chain[-1][1] != state:
                problems.append(f"job {job_id}: state {state} but last event says "
                                f"{chain[-1][1]}")
        return problems

    def transitions(self, job_id: int) -> builtins.list[tuple[str | None, str]]:
        """The (from, to) states of a job's submission and transitions, in order."""
        with self._tx(write=False) as conn:
            return [(r[0], r[1]) for r in conn.execute(
                "SELECT from_state, to_state FROM events WHERE job_id = ? AND "
                "to_state IS NOT NULL ORDER BY id", (job_id,))]

    def edit(self, job_id: int, from_states: Iterable[str], changes: dict[str, Any], *,
             now: float, detail: str) -> Job:
        """Change a waiting job's request (``gpuwarden edit``): ``changes`` maps JobSpec
        fields (see _EDIT_COLUMNS) to their new values, written with an ``edited`` event in
        one transaction, only while the job is in one of ``from_states`` (else Conflict).
        A new ``mem`` is the budget from then on, also after an OOM retry raised it."""
        froms = states_arg(from_states)
        unknown = set(changes) - set(_EDIT_COLUMNS)
        if unknown:
            raise TypeError(f"edit() cannot set {', '.join(sorted(unknown))}")
        edited = dataclasses.replace(JobSpec(command=("x",), user="", uid=0, gid=0), **{
            k: v for k, v in changes.items()})
        check_spec(edited)
        with self._tx(write=True) as conn:
            row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(job_id)
            if row["state"] not in froms:
                raise Conflict(f"job {job_id} is {row['state']}, not {'/'.join(froms)}",
                               job_id=job_id, state=row["state"])
            sets = ", ".join(f"{_EDIT_COLUMNS[k]} = ?" for k in sorted(changes))
            if "mem" in changes:  # the user's new budget replaces one an OOM retry raised
                sets += ", retry_mem = NULL, retry_ceiling = NULL, ceiling_until = NULL"
            conn.execute(f"UPDATE jobs SET {sets} WHERE id = ?",
                         [*(changes[k] for k in sorted(changes)), job_id])
            conn.execute("INSERT INTO events (job_id, at, kind, detail) VALUES "
                         "(?, ?, 'edited', ?)", (job_id, now, detail))
            return self._load(conn, job_id)

    # -- drained GPUs ------------------------------------------------------------------
    def drain(self, gpu: int, reason: str | None, by: str, now: float) -> bool:
        """Mark GPU ``gpu`` drained (no new placement there); False when it was already
        (its reason and who drained it are then updated)."""
        with self._tx(write=True) as conn:
            had = conn.execute("SELECT 1 FROM drains WHERE gpu = ?", (gpu,)).fetchone()
            conn.execute("INSERT OR REPLACE INTO drains (gpu, reason, by_user, at) "
                         "VALUES (?, ?, ?, ?)", (gpu, reason, by, now))
            return had is None

    def undrain(self, gpu: int) -> bool:
        """Let placement use GPU ``gpu`` again; False when it was not drained."""
        with self._tx(write=True) as conn:
            return conn.execute("DELETE FROM drains WHERE gpu = ?", (gpu,)).rowcount > 0

    def drains(self) -> dict[int, dict[str, Any]]:
        """GPU index -> {reason, by, at} of every drained GPU."""
        with self._tx(write=False) as conn:
            return {int(r[0]): {"reason": r[1], "by": r[2], "at": float(r[3])}
                    for r in conn.execute("SELECT gpu, reason, by_user, at FROM drains "
                                          "ORDER BY gpu")}
