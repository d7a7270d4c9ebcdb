"""The store's memory holds: GPU memory an ended attempt keeps reserved until it is
verified back (invariant 5), written by the transition that ends the attempt and closed
(memory back, or cleared) or marked leaked by the loop. Functions of an open
transaction's connection; ``Store`` owns the transactions."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gpuwarden.daemon.rows import hold_columns, json_ids, row_to_hold
from gpuwarden.daemon.sql import events
from gpuwarden.jobs import lifecycle
from gpuwarden.jobs.model import Hold, NewHold


def latest_holds(conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, Hold]:
    """The latest hold of each job that has one."""
    if not ids:
        return {}
    rows = conn.execute(
        "SELECT * FROM holds WHERE id IN (SELECT max(id) FROM holds WHERE job_id IN "
        "(SELECT value FROM json_each(?)) GROUP BY job_id)",
        (json_ids(ids),),
    )
    return {r["job_id"]: row_to_hold(r) for r in rows}


def add_hold(conn: sqlite3.Connection, job_id: int, attempt: int, hold: NewHold) -> None:
    """Keep what attempt ``attempt`` of the job leaves reserved."""
    columns = {"job_id": job_id, "attempt": attempt, **hold_columns(hold)}
    conn.execute(
        f"INSERT INTO holds ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        list(columns.values()),
    )


def open_holds(conn: sqlite3.Connection) -> list[Hold]:
    """Holds not yet verified back (or cleared), oldest first."""
    return [
        row_to_hold(r)
        for r in conn.execute("SELECT * FROM holds WHERE released_at IS NULL ORDER BY id")
    ]


def close_hold(
    conn: sqlite3.Connection, hold_id: int, now: float, how: str, *, kind: str, detail: str
) -> bool:
    """Release an open hold and note it on its job; False when it was closed already."""
    row = conn.execute(
        "SELECT job_id FROM holds WHERE id = ? AND released_at IS NULL", (hold_id,)
    ).fetchone()
    if row is None:
        return False
    conn.execute("UPDATE holds SET released_at = ?, how = ? WHERE id = ?", (now, how, hold_id))
    events.append(conn, row["job_id"], now, kind, detail)
    return True


def report_leak(conn: sqlite3.Connection, hold_id: int, what: str, now: float) -> bool:
    """Mark an open hold leaked, with a ``leak`` event; False when it is closed or was
    marked already."""
    row = conn.execute(
        "SELECT job_id FROM holds WHERE id = ? AND released_at IS NULL AND leak IS NULL", (hold_id,)
    ).fetchone()
    if row is None:
        return False
    conn.execute("UPDATE holds SET leak = ? WHERE id = ?", (what, hold_id))
    events.append(conn, row["job_id"], now, lifecycle.LEAK, what)
    return True
