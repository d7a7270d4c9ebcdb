"""Every write to a job's row: its submission (with its ``submitted`` event), the
compare-and-set transitions (invariant 2: the state, its fields and its event in one
UPDATE and INSERT, the ended attempt's memory hold beside them), edits of a waiting
job, and the figures the loop keeps current (why a job waits, its peak memory). Checks
that need no database run before the transaction (``plan_transition``, ``check_edit``);
the rest are functions of an open transaction's connection, and ``Store`` owns the
transactions."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterable
from typing import Any

from gpuwarden.daemon.rows import (
    check_spec,
    field_value,
    ints_ok,
    json_ids,
    keep_attempt_use,
    spec_columns,
    states_arg,
)
from gpuwarden.daemon.schema import RELEASED_SQL
from gpuwarden.daemon.sql import events
from gpuwarden.daemon.sql.holds import add_hold
from gpuwarden.daemon.sql.job_queries import load
from gpuwarden.daemon.store_errors import Conflict, DependencyNotFound, JobNotFound
from gpuwarden.jobs import lifecycle
from gpuwarden.jobs.arrays import Array
from gpuwarden.jobs.model import HELD, QUEUED, STATES, Job, JobSpec, NewHold
from gpuwarden.jobs.request import EDITABLE, FIELDS

# Columns a transition may set (rows.field_value: how each is stored).
TRANSITION_FIELDS = frozenset(
    {
        "started_at",
        "ended_at",
        "gpus",
        "gpu_uuids",
        "budget",
        "exit_code",
        "reason",
        "supervisor_pid",
        "supervisor_start",
        "boot_id",
        "attempts",
        "peak_memory",
        "preempting_at",
        "preemptions",
        "oom_retries",
        "retry_mem",
        "retry_ceiling",
        "ceiling_until",
        "not_before",
        "kill_reason",
        "cpu_set",
        "oom_tried",
        "oom_need",
        "context",
        "restarts",
        "health_failures",  # a service's
    }
)
WAITING = (QUEUED, HELD)
# What ``edit`` may change in a waiting job: JobSpec field -> column.
EDIT_COLUMNS = {name: FIELDS[name].column for name in EDITABLE}


def submit(
    conn: sqlite3.Connection,
    spec: JobSpec,
    now: float,
    state: str,
    reason: str | None,
    array: Array | None,
) -> tuple[Job, bool]:
    """Store a checked request as a job, or as an array's tasks (see ``Store.submit``)."""
    if spec.key is not None:
        row = conn.execute(
            f"SELECT id FROM jobs WHERE uid = ? AND job_key = ? AND state NOT IN ({RELEASED_SQL})",
            (spec.uid, spec.key),
        ).fetchone()
        if row is not None:
            return load(conn, row["id"]), False
    deps = (*spec.after, *spec.after_any, *spec.after_fail)
    if deps:
        wanted = sorted(set(deps))
        found = {
            r[0]
            for r in conn.execute(
                "SELECT id FROM jobs WHERE id IN (SELECT value FROM json_each(?))",
                (json_ids(wanted),),
            )
        }
        missing = [i for i in wanted if i not in found]
        if missing:
            raise DependencyNotFound(missing)
    if array is None:
        return load(conn, insert(conn, spec, now, state, reason)), True
    first: int | None = None
    for index in array.indices:
        job_id = insert(conn, spec, now, state, reason)
        first = job_id if first is None else first
        conn.execute(
            "UPDATE jobs SET array_id = ?, array_index = ?, array_limit = ? WHERE id = ?",
            (first, index, array.limit, job_id),
        )
    assert first is not None
    return load(conn, first), True


def insert(
    conn: sqlite3.Connection, spec: JobSpec, now: float, state: str, reason: str | None
) -> int:
    """One job's row and its ``submitted`` event; returns its id."""
    columns = {**spec_columns(spec), "state": state, "submitted_at": now, "reason": reason}
    cur = conn.execute(
        f"INSERT INTO jobs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        list(columns.values()),
    )
    job_id = cur.lastrowid
    assert job_id is not None
    events.append(
        conn, job_id, now, lifecycle.SUBMITTED, reason if state != QUEUED else None, None, state
    )
    return job_id


@dataclasses.dataclass
class TransitionPlan:
    """A transition checked before its transaction: the states it may move the job
    from, and its UPDATE's assignments and their values (the state's first, None until
    the current state is read when the transition keeps it)."""

    froms: tuple[str, ...]
    to_state: str | None
    sets: list[str]
    args: list[Any]
    clears_start: bool  # it clears ``started_at``: the attempt's use is kept


def plan_transition(
    job_id: int,
    from_states: str | Iterable[str],
    to_state: str | None,
    kind: str,
    fields: dict[str, object],
) -> TransitionPlan:
    """Check a transition's arguments (ValueError, IllegalTransition, TypeError,
    JobNotFound) and make its UPDATE's assignments."""
    froms = states_arg(from_states)
    if to_state is not None and to_state not in STATES:
        raise ValueError(f"unknown job state: {to_state}")
    lifecycle.check(kind, froms, to_state)
    unknown = set(fields) - TRANSITION_FIELDS
    if unknown:
        raise TypeError(f"transition() cannot set {', '.join(sorted(unknown))}")
    sets = ["state = ?"]
    args: list[Any] = [to_state]
    for name, value in sorted(fields.items()):
        sets.append(f"{name} = ?")
        args.append(field_value(name, value))
    if not ints_ok(job_id):
        raise JobNotFound(job_id)
    return TransitionPlan(
        froms, to_state, sets, args, "started_at" in fields and fields["started_at"] is None
    )


def transition(
    conn: sqlite3.Connection,
    job_id: int,
    plan: TransitionPlan,
    *,
    now: float,
    kind: str,
    detail: str | None,
    hold: NewHold | None,
) -> tuple[str, Job]:
    """Carry out a planned compare-and-set: the UPDATE, its event and the hold, or
    Conflict when the job is in none of the plan's states (JobNotFound when it does not
    exist). Returns the state it was in and the job as it is now."""
    sets, args, to_state = plan.sets, list(plan.args), plan.to_state
    row = conn.execute(
        "SELECT state, attempts, started_at, ended_at, gpus, budget, "
        "peak_memory FROM jobs WHERE id = ?",
        (job_id,),
    ).fetchone()
    if row is None:
        raise JobNotFound(job_id)
    current = row["state"]
    if current not in plan.froms:
        raise Conflict(
            f"job {job_id} is {current}, not {'/'.join(plan.froms)}", job_id=job_id, state=current
        )
    if to_state is None:
        to_state = args[0] = current
    if plan.clears_start and row["started_at"] is not None:  # the attempt's figures go
        sets, args = keep_attempt_use(row, current, now, sets, args)
    try:
        conn.execute(
            f"UPDATE jobs SET {', '.join(sets)} WHERE id = ? AND state = ?",
            [*args, job_id, current],
        )
    except sqlite3.IntegrityError:  # the live-key index: retry while key in use
        raise Conflict(
            f"job {job_id} cannot become {to_state}: another job of this user holds its key",
            job_id=job_id,
            state=current,
        ) from None
    events.append(conn, job_id, now, kind, detail, current, to_state)
    if hold is not None and hold.gpu_uuids:
        add_hold(conn, job_id, row["attempts"], hold)
    return current, load(conn, job_id)


def check_edit(from_states: Iterable[str], changes: dict[str, Any]) -> tuple[str, ...]:
    """Check an edit before its transaction (TypeError for a field ``edit`` does not
    change, UsageError for a value the database cannot hold); returns its states."""
    froms = states_arg(from_states)
    unknown = set(changes) - set(EDIT_COLUMNS)
    if unknown:
        raise TypeError(f"edit() cannot set {', '.join(sorted(unknown))}")
    edited = dataclasses.replace(
        JobSpec(command=("x",), user="", uid=0, gid=0), **{k: v for k, v in changes.items()}
    )
    check_spec(edited)
    return froms


def edit(
    conn: sqlite3.Connection,
    job_id: int,
    froms: tuple[str, ...],
    changes: dict[str, Any],
    *,
    now: float,
    detail: str,
) -> Job:
    """Write a checked edit and its ``edited`` event while the job is in one of
    ``froms`` (else Conflict)."""
    row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise JobNotFound(job_id)
    if row["state"] not in froms:
        raise Conflict(
            f"job {job_id} is {row['state']}, not {'/'.join(froms)}",
            job_id=job_id,
            state=row["state"],
        )
    sets = ", ".join(f"{EDIT_COLUMNS[k]} = ?" for k in sorted(changes))
    if "mem" in changes:  # the user's new budget replaces one an OOM retry raised
        sets += ", retry_mem = NULL, retry_ceiling = NULL, ceiling_until = NULL"
    conn.execute(
        f"UPDATE jobs SET {sets} WHERE id = ?", [*(changes[k] for k in sorted(changes)), job_id]
    )
    events.append(conn, job_id, now, lifecycle.EDITED, detail)
    return load(conn, job_id)


def set_reason(
    conn: sqlite3.Connection, job_id: int, reason: str | None, now: float | None
) -> bool:
    """Write why a waiting job waits, with a ``waiting`` event when ``now`` is given,
    only when it changed; returns whether it did."""
    cur = conn.execute(
        "UPDATE jobs SET reason = ? WHERE id = ? AND state IN (?, ?) AND reason IS NOT ?",
        (reason, job_id, *WAITING, reason),
    )
    if not cur.rowcount:
        return False
    if now is not None:
        events.append(conn, job_id, now, lifecycle.WAITING, reason)
    return True


def set_reasons(conn: sqlite3.Connection, reasons: dict[int, str]) -> None:
    """``set_reason`` for many jobs, with no events."""
    conn.executemany(
        "UPDATE jobs SET reason = ? WHERE id = ? AND state IN (?, ?) AND reason IS NOT ?",
        [(why, job_id, *WAITING, why) for job_id, why in reasons.items()],
    )


def set_peak(conn: sqlite3.Connection, job_id: int, nbytes: int) -> bool:
    """Raise the job's recorded peak memory to ``nbytes`` if higher; returns whether it
    changed (JobNotFound when there is no such job)."""
    cur = conn.execute(
        "UPDATE jobs SET peak_memory = ? WHERE id = ? AND (peak_memory IS NULL OR peak_memory < ?)",
        (nbytes, job_id, nbytes),
    )
    if cur.rowcount:
        return True
    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
        raise JobNotFound(job_id)
    return False


def set_allocated_peak(conn: sqlite3.Connection, job_id: int, nbytes: int) -> None:
    conn.execute("UPDATE jobs SET allocated_peak = ? WHERE id = ?", (nbytes, job_id))


def ids_above(conn: sqlite3.Connection, floor: int) -> int | None:
    """Raise the id sequence to ``floor`` when this database issued less (see
    ``Store.ids_above``)."""
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
    top = conn.execute("SELECT coalesce(max(id), 0) FROM jobs").fetchone()[0]
    issued = max(int(top), 0 if row is None else int(row[0]))
    if issued >= floor:
        return None
    if row is None:
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)", (floor,))
    else:
        conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs'", (floor,))
    return issued
