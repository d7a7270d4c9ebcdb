"""The state database's shape, and how a file an older gpuwarden wrote is brought up to
date. Migration n takes a file from schema version n-1 to n; ``migrate`` runs those a
file lacks, in order and in one transaction, when ``Store`` opens it, and refuses a file
newer than this list. A file past a migration never runs it again, so a change to the shape is a
new migration at the end, never an edit of one already released.

Decisions, and why:

* Transition events also store the state they came from and went to (internal columns
  ``from_state``/``to_state``), so ``audit`` can prove that the events and the state
  agree: no state change without its event, no event without its state change.
* Idempotent keys: a partial UNIQUE index on ``(uid, key)`` over jobs that are not
  failed, cancelled or infeasible. Keys are per user: another user's key neither finds
  nor blocks yours.
* Job ids never repeat (``AUTOINCREMENT``), even after ``rm``: a stale id cannot name
  a new job, nor its log directory. A database made anew beside old job directories
  starts above them (``Store.ids_above``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwarden.daemon.store_errors import SchemaTooNew, StoreError
from gpuwarden.jobs.model import CANCELLED, FAILED, INFEASIBLE, TERMINAL

Migration = Callable[[sqlite3.Connection], None]

# Key-releasing states: a job in one of these no longer holds its idempotency key.
KEY_RELEASED = frozenset({FAILED, CANCELLED, INFEASIBLE})
RELEASED_SQL = ", ".join(f"'{s}'" for s in sorted(KEY_RELEASED))
TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(TERMINAL))  # the states of ended jobs


def sql(*statements: str) -> Migration:
    """A migration made of plain SQL statements (run one by one: ``executescript``
    would commit the surrounding transaction)."""

    def apply(conn: sqlite3.Connection) -> None:
        for statement in statements:
            conn.execute(statement)

    return apply


MIGRATIONS: list[Migration] = [
    # 1: jobs and their events.
    sql(
        """CREATE TABLE jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            user TEXT NOT NULL,
            uid INTEGER NOT NULL,
            gid INTEGER NOT NULL,
            groups TEXT NOT NULL,          -- JSON list of gids
            cwd TEXT NOT NULL,
            env TEXT NOT NULL,             -- JSON object
            command TEXT NOT NULL,         -- JSON list (argv)
            name TEXT,
            job_group TEXT,
            job_key TEXT,
            mem INTEGER,
            gpu_count INTEGER NOT NULL,
            gpu_ids TEXT,                  -- JSON list or NULL
            after_ids TEXT NOT NULL,       -- JSON list of job ids
            timeout REAL,
            exclusive INTEGER NOT NULL,
            priority INTEGER NOT NULL,
            requeue_on_reboot INTEGER NOT NULL,
            state TEXT NOT NULL,
            submitted_at REAL NOT NULL,
            started_at REAL,
            ended_at REAL,
            gpus TEXT NOT NULL DEFAULT '[]',
            gpu_uuids TEXT NOT NULL DEFAULT '[]',
            budget INTEGER,
            peak_memory INTEGER,
            exit_code INTEGER,
            reason TEXT,
            supervisor_pid INTEGER,
            supervisor_start REAL,
            boot_id TEXT,
            attempts INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            detail TEXT,
            from_state TEXT,               -- set on transitions (NULL on submit)
            to_state TEXT                  -- set on submit and transitions only
        )""",
    ),
    # 2: indexes, and the idempotent-key rule as a constraint.
    sql(
        "CREATE INDEX events_job ON events(job_id, id)",
        "CREATE INDEX jobs_state ON jobs(state)",
        f"""CREATE UNIQUE INDEX jobs_live_key ON jobs(uid, job_key)
            WHERE job_key IS NOT NULL AND state NOT IN ({RELEASED_SQL})""",
    ),
    # 3: scheduling policies: QoS and limits asked for, preemption and OOM-retry state.
    sql(
        "ALTER TABLE jobs ADD COLUMN qos TEXT NOT NULL DEFAULT 'burstable'",
        "ALTER TABLE jobs ADD COLUMN mem_limit INTEGER",
        "ALTER TABLE jobs ADD COLUMN grace REAL",
        "ALTER TABLE jobs ADD COLUMN no_requeue INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN checkpoint INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN preempting_at REAL",
        "ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN oom_retries INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN retry_mem INTEGER",
        "ALTER TABLE jobs ADD COLUMN not_before REAL",
        "ALTER TABLE jobs ADD COLUMN kill_reason TEXT",
        "ALTER TABLE jobs ADD COLUMN mps INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN sm_percent INTEGER",
        "ALTER TABLE jobs ADD COLUMN mem_auto INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN cpus INTEGER",
        "ALTER TABLE jobs ADD COLUMN no_numa INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN cpu_set TEXT NOT NULL DEFAULT '[]'",
        # Memory an ended attempt keeps reserved until it is verified back.
        """CREATE TABLE holds (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            attempt INTEGER NOT NULL,
            gpu_uuids TEXT NOT NULL,       -- JSON list
            budget INTEGER NOT NULL,
            pids TEXT NOT NULL,            -- JSON list: its processes, as last seen
            baseline TEXT NOT NULL,        -- JSON object: uuid -> unaccounted bytes
            exited_at REAL NOT NULL,
            released_at REAL,
            how TEXT,
            leak TEXT
        )""",
        "CREATE INDEX holds_job ON holds(job_id, id)",
        "CREATE INDEX holds_open ON holds(released_at) WHERE released_at IS NULL",
    ),
    # 4: memory samples per GPU for the web page's history (see daemon/history.py).
    sql(
        """CREATE TABLE samples (
            gpu TEXT NOT NULL,             -- uuid
            ts INTEGER NOT NULL,           -- unix seconds
            idx INTEGER NOT NULL,
            total INTEGER NOT NULL,
            used INTEGER NOT NULL,
            leaked INTEGER NOT NULL,       -- memory no listed process accounts for
            parts TEXT NOT NULL,           -- JSON: {"j": {job id: bytes}, "u": {user: bytes}}
            PRIMARY KEY (gpu, ts)
        ) WITHOUT ROWID""",
        "CREATE INDEX samples_ts ON samples(ts)",
    ),
    # 5: jobs another launcher starts and the daemon places and watches (daemon/attached.py).
    # ... and the start times of an ended attempt's processes, to know them again.
    sql(
        "ALTER TABLE jobs ADD COLUMN attach TEXT", "ALTER TABLE holds ADD COLUMN starts TEXT"
    ),  # JSON object: pid -> start time
    # 6: what the latest CUDA OOM showed: the allocation that failed, what the job needed.
    sql(
        "ALTER TABLE jobs ADD COLUMN oom_tried INTEGER",
        "ALTER TABLE jobs ADD COLUMN oom_need INTEGER",
    ),
    # 7: the CUDA context allowance booked beside a job's budget, and the measurements
    # it comes from, per GPU model and driver (sched/context.py).
    sql(
        "ALTER TABLE jobs ADD COLUMN context INTEGER",
        "ALTER TABLE jobs ADD COLUMN allocated_peak INTEGER",  # the cap hook's report
        """CREATE TABLE contexts (
            model TEXT NOT NULL,
            driver TEXT NOT NULL,
            at REAL NOT NULL,
            bytes INTEGER NOT NULL
        )""",
        "CREATE INDEX contexts_model ON contexts(model, driver, at)",
    ),
    # 8: the most an OOM retry of a job that crept into its cap may take (sched/oom.py).
    # ... and until when it waits for room for that ceiling.
    sql(
        "ALTER TABLE jobs ADD COLUMN retry_ceiling INTEGER",
        "ALTER TABLE jobs ADD COLUMN ceiling_until REAL",
    ),
    # 9: drained GPUs: no new placement there until undrained (gpuwarden gpu drain).
    sql("""CREATE TABLE IF NOT EXISTS drains (
            gpu INTEGER PRIMARY KEY,       -- index, as placement numbers GPUs
            reason TEXT,
            by_user TEXT NOT NULL,
            at REAL NOT NULL
        )"""),
    # 10: services: a restart policy and health check (JSON, daemon/restart.py), the
    # restarts so far and the failed health checks.
    sql(
        "ALTER TABLE jobs ADD COLUMN service TEXT",
        "ALTER TABLE jobs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN health_failures INTEGER NOT NULL DEFAULT 0",
    ),
    # 11: dependencies beside --after (success): --after-any (any end), --after-fail.
    sql(
        "ALTER TABLE jobs ADD COLUMN after_any_ids TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE jobs ADD COLUMN after_fail_ids TEXT NOT NULL DEFAULT '[]'",
    ),
    # 12: a MIG instance profile the job asks for (--mig 3g.40gb).
    sql("ALTER TABLE jobs ADD COLUMN mig TEXT"),
    # 13: a command run as the user once the job ends (--notify).
    sql("ALTER TABLE jobs ADD COLUMN notify TEXT"),
    # 14: arrays (--array 0-99%8): the array's id (its first task's), the task's index
    # and the array's limit on tasks at once.
    sql(
        "ALTER TABLE jobs ADD COLUMN array_id INTEGER",
        "ALTER TABLE jobs ADD COLUMN array_index INTEGER",
        "ALTER TABLE jobs ADD COLUMN array_limit INTEGER",
        "CREATE INDEX jobs_array ON jobs (array_id, array_index)",
    ),
    # 15: what a job's earlier attempts used (a requeue, an OOM retry, a restart, a
    # retry clears the attempt's own fields): GPU-seconds, and byte-seconds reserved
    # (budget) and used (peak) over its GPUs, for `report`.
    sql(
        "ALTER TABLE jobs ADD COLUMN earlier_gpu_seconds REAL NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN earlier_reserved REAL NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN earlier_used REAL NOT NULL DEFAULT 0",
    ),
    # 16: the options document (jobs/request.OPTIONS): a JSON object of the stored
    # request fields that have no column of their own, by name, each only where it is
    # not its default. A later option is kept there without a migration.
    sql("ALTER TABLE jobs ADD COLUMN options TEXT NOT NULL DEFAULT '{}'"),
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, migrations: Sequence[Migration], path: Path) -> None:
    """Bring the schema of the database at ``path`` to the newest version, all in one
    transaction; refuse a database from a newer gpuwarden."""
    target = len(migrations)
    conn.execute("BEGIN IMMEDIATE")
    try:
        have_table = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'"
        ).fetchone()
        if have_table is None:
            others = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            ).fetchone()[0]
            if others:
                raise StoreError(
                    f"{path} is not a gpuwarden state database "
                    "(it has tables but no schema_version)"
                )
            conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO schema_version (version) VALUES (0)")
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = 0 if row is None else int(row[0])
        if version > target:
            raise SchemaTooNew(
                f"state database {path} has schema version {version}, newer "
                f"than this gpuwarden understands ({target}); upgrade gpuwarden"
            )
        for number in range(version + 1, target + 1):
            migrations[number - 1](conn)
        if version != target:
            conn.execute("UPDATE schema_version SET version = ?", (target,))
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
