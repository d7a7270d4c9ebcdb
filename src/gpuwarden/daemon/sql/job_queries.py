"""Reading jobs from the store: one job with its history and latest hold, the filtered
and paged listing, job references resolved to ids, and the queue's figures. Functions
of an open transaction's connection; ``Store`` owns the transactions."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from gpuwarden.daemon.rows import ints_ok, json_ids, row_to_job, states_arg
from gpuwarden.daemon.sql.events import events_of
from gpuwarden.daemon.sql.holds import latest_holds
from gpuwarden.daemon.store_errors import JobNotFound
from gpuwarden.jobs.arrays import Ref
from gpuwarden.jobs.model import QUEUED, STATES, Event, Hold, Job


def load(conn: sqlite3.Connection, job_id: int) -> Job:
    """The job with its events and latest hold; JobNotFound when there is none."""
    row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise JobNotFound(job_id)
    return row_to_job(
        row, events_of(conn, [job_id])[job_id], latest_holds(conn, [job_id]).get(job_id)
    )


def columns_but_env(conn: sqlite3.Connection) -> str:
    """The jobs table's columns, env read as NULL (it is NOT NULL in the table, so
    NULL says: not read)."""
    names = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
    return ", ".join("NULL AS env" if n == "env" else f'"{n}"' for n in names)


def listing(
    states: Iterable[str] | None,
    user: str | None,
    group: str | None,
    ids: Iterable[int] | None,
    limit: int | None,
    *,
    newest: bool,
    before: int | None,
    after: int | None,
    array: int | None,
) -> tuple[str, list[Any]]:
    """What follows ``SELECT ... FROM jobs`` in ``Store.list``'s query (its filters,
    order and limit), and its arguments."""
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
    sql = " WHERE " + " AND ".join(where) if where else ""
    sql += " ORDER BY id DESC" if newest else " ORDER BY id"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(max(0, limit))
    return sql, args


Listed = tuple[list[sqlite3.Row], dict[int, list[Event]], dict[int, Hold]]


def list_rows(
    conn: sqlite3.Connection, sql: str, args: Sequence[Any], *, with_events: bool
) -> Listed:
    """The rows a query of ``listing`` finds, with their events and holds if asked:
    read in the transaction, decoded by ``jobs_of`` after it (a page of 1,000 jobs
    took 30 ms to decode, all of it holding the store's lock, where a submit waits)."""
    rows = conn.execute(sql, args).fetchall()
    ids = [r["id"] for r in rows]
    events = events_of(conn, ids) if with_events else {}
    holds = latest_holds(conn, ids) if with_events else {}
    return rows, events, holds


def jobs_of(listed: Listed) -> list[Job]:
    rows, events, holds = listed
    return [row_to_job(r, events.get(r["id"], ()), holds.get(r["id"])) for r in rows]


def resolve(conn: sqlite3.Connection, refs: Sequence[Ref]) -> tuple[list[int], list[Ref]]:
    """The ids that references name, sorted, and the references that name nothing, in
    their order, once each (see ``Store.resolve``)."""
    plain = sorted({r for r in refs if isinstance(r, int) and ints_ok(r)})
    found: set[int] = set()
    named: set[Ref] = set()
    for row in conn.execute(
        "SELECT id, array_id FROM jobs WHERE id IN (SELECT value FROM json_each(?))"
        " OR array_id IN (SELECT value FROM json_each(?))",
        (json_ids(plain), json_ids(plain)),
    ):
        found.add(row["id"])
        named.update(i for i in (row["id"], row["array_id"]) if i is not None)
    for ref in {r for r in refs if isinstance(r, tuple) and ints_ok(*r)}:
        row = conn.execute(
            "SELECT id FROM jobs WHERE array_id = ? AND array_index = ?", ref
        ).fetchone()
        if row is not None:
            found.add(row["id"])
            named.add(ref)
    return sorted(found), list(dict.fromkeys(r for r in refs if r not in named))


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Number of jobs per state (every state present, zero included)."""
    rows = conn.execute("SELECT state, count(*) FROM jobs GROUP BY state")
    found = {r[0]: r[1] for r in rows}
    return {s: found.get(s, 0) for s in STATES} | {
        s: n for s, n in found.items() if s not in STATES
    }


def stats(conn: sqlite3.Connection, now: float) -> dict[str, Any]:
    """The queue's figures for /metrics (see ``Store.stats``)."""
    by = {
        (r[0], r[1]): r[2]
        for r in conn.execute("SELECT state, qos, count(*) FROM jobs GROUP BY state, qos")
    }
    totals = conn.execute(
        "SELECT coalesce(sum(oom_retries), 0), coalesce(sum(preemptions), 0) FROM jobs"
    ).fetchone()
    leaks = conn.execute("SELECT count(*) FROM events WHERE kind = 'leak'").fetchone()[0]
    oldest = conn.execute(
        "SELECT min(submitted_at) FROM jobs WHERE state = ?", (QUEUED,)
    ).fetchone()[0]
    waits = [
        r[0]
        for r in conn.execute(
            "SELECT started_at - submitted_at FROM jobs WHERE started_at IS NOT NULL"
        )
    ]
    releases = [
        r[0]
        for r in conn.execute("SELECT released_at - exited_at FROM holds WHERE how = 'verified'")
    ]
    # Services not ended, or ended within a day: their restart counters.
    services = [
        (r[0], r[1], r[2], r[3])
        for r in conn.execute(
            "SELECT id, user, restarts, health_failures FROM jobs WHERE service IS NOT "
            "NULL AND (ended_at IS NULL OR ended_at > ?) ORDER BY id",
            (now - 86400,),
        )
    ]
    return {
        "jobs": by,
        "oom_retries": totals[0],
        "preemptions": totals[1],
        "leaks": leaks,
        "oldest_wait": None if oldest is None else now - oldest,
        "waits": waits,
        "releases": releases,
        "services": services,
    }
