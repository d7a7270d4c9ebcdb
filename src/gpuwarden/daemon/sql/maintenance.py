"""Removing finished jobs from the store (``rm`` one, ``clean`` the old ones), never one
an unfinished job still depends on or one whose memory is not verified back, and
SQLite's own check of the file. Functions of an open transaction's connection;
``Store`` owns the transactions."""

from __future__ import annotations

import sqlite3
from typing import Any

from gpuwarden.daemon.schema import TERMINAL_SQL
from gpuwarden.daemon.sql.job_queries import load
from gpuwarden.daemon.store_errors import Conflict
from gpuwarden.jobs.model import Job

# Ids that a job not yet finished still waits for: they cannot be removed.
NEEDED_SQL = " UNION ".join(  # --after, --after-any, --after-fail
    f"SELECT d.value FROM jobs AS w, json_each(w.{column}) AS d "
    f"WHERE w.state NOT IN ({TERMINAL_SQL})"
    for column in ("after_ids", "after_any_ids", "after_fail_ids")
)


def delete(conn: sqlite3.Connection, job_id: int) -> Job:
    """Remove a finished job and its events (see ``Store.delete``); returns it."""
    job = load(conn, job_id)
    if not job.terminal:
        raise Conflict(
            f"job {job_id} is {job.state}; only finished jobs can be removed",
            job_id=job_id,
            state=job.state,
        )
    if job.release is not None and job.release.open:
        raise Conflict(
            f"job {job_id} still holds GPU memory that is not verified "
            "back; it can be removed once it is (or an admin clears it)",
            job_id=job_id,
            state=job.state,
        )
    waiting = conn.execute(f"SELECT 1 FROM ({NEEDED_SQL}) WHERE value = ?", (job_id,)).fetchone()
    if waiting is not None:
        raise Conflict(
            f"job {job_id} is a dependency of a job that has not finished",
            job_id=job_id,
            state=job.state,
        )
    conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
    return job


def clean(
    conn: sqlite3.Connection, older_than_seconds: float, now: float, *, user: str | None = None
) -> int:
    """Remove the finished jobs that may go and ended before ``now`` less
    ``older_than_seconds`` (see ``Store.clean``); returns how many."""
    sql = (
        f"DELETE FROM jobs WHERE state IN ({TERMINAL_SQL}) "
        f"AND coalesce(ended_at, submitted_at) < ? AND id NOT IN ({NEEDED_SQL}) "
        "AND id NOT IN (SELECT job_id FROM holds WHERE released_at IS NULL)"
    )
    args: list[Any] = [now - older_than_seconds]
    if user is not None:
        sql += " AND user = ?"
        args.append(user)
    return conn.execute(sql, args).rowcount


def integrity(conn: sqlite3.Connection) -> str:
    """SQLite's own check of the file: ``ok`` when sound."""
    rows = conn.execute("PRAGMA integrity_check").fetchall()
    return "\n".join(str(r[0]) for r in rows)
