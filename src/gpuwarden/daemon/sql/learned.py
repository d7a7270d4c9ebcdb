"""What the store's ended jobs teach later ones: the memory and run times of a user's
succeeded jobs of the same key or name (``--mem auto``, backfill's estimates), the
memory jobs held lately (fair share), and a group's latest ends and releases (its
failure streak). Functions of an open transaction's connection; ``Store`` owns the
transactions."""

from __future__ import annotations

import sqlite3
from typing import Any

from gpuwarden.daemon.schema import TERMINAL_SQL
from gpuwarden.jobs.model import ACTIVE, RESERVED, RUNNING, SUCCEEDED
from gpuwarden.sched.fairshare import Span

# A figure of a succeeded job: its SQL, and the condition under which the job has one.
Figure = tuple[str, str]
# What its allocations peaked at: the cap hook's report, else the driver's peak less
# the CUDA context booked beside the budget.
PEAK: Figure = (
    "coalesce(allocated_peak, max(peak_memory - coalesce(context, 0), 0))",
    "peak_memory IS NOT NULL",
)
# Its run time: the start of its last attempt to its end.
RUNTIME: Figure = ("ended_at - started_at", "started_at IS NOT NULL AND ended_at IS NOT NULL")


def same_job(key: str | None, name: str | None) -> tuple[str, str] | None:
    """Which earlier jobs count as the same: the condition and its argument (the key,
    else the name), or None when the job has neither."""
    if key is not None:
        return "job_key = ?", key
    if name is not None:
        return "name = ?", name
    return None


def succeeded(
    conn: sqlite3.Connection, uid: int, same: tuple[str, str], limit: int, figure: Figure
) -> list[Any]:
    """One figure of this user's latest succeeded jobs that are ``same``, newest first."""
    where, arg = same
    value_sql, known_sql = figure
    rows = conn.execute(
        f"SELECT {value_sql} FROM jobs WHERE uid = ? AND {where} AND state = ? "
        f"AND {known_sql} ORDER BY ended_at DESC, id DESC LIMIT ?",
        (uid, arg, SUCCEEDED, limit),
    )
    return [r[0] for r in rows]


def usage_spans(conn: sqlite3.Connection, since: float) -> list[Span]:
    """The memory jobs held since ``since`` (see ``Store.usage_spans``)."""
    rows = conn.execute(
        "SELECT user, budget, json_array_length(gpus) AS n, started_at, ended_at, "
        "state FROM jobs WHERE started_at IS NOT NULL AND budget IS NOT NULL AND "
        "(state IN (?, ?) OR (ended_at IS NOT NULL AND ended_at >= ?))",
        (RESERVED, RUNNING, since),
    ).fetchall()
    return [
        Span(
            r["user"],
            r["budget"] * max(r["n"], 1),
            r["started_at"],
            None if r["state"] in ACTIVE else r["ended_at"],
        )
        for r in rows
    ]


def recent_end_ids(conn: sqlite3.Connection, uid: int, group: str, limit: int) -> list[int]:
    """The ids of this user's latest ended jobs of ``group``, newest first."""
    return [
        r[0]
        for r in conn.execute(
            f"SELECT id FROM jobs WHERE uid = ? AND job_group = ? AND state IN "
            f"({TERMINAL_SQL}) ORDER BY ended_at DESC, id DESC LIMIT ?",
            (uid, group, limit),
        )
    ]


def group_released_since(conn: sqlite3.Connection, uid: int, group: str, since: float) -> bool:
    """Whether one of this user's jobs of ``group`` was released at or after ``since``."""
    row = conn.execute(
        "SELECT 1 FROM events e JOIN jobs j ON j.id = e.job_id WHERE j.uid = ? AND "
        "j.job_group = ? AND e.kind = 'released' AND e.at >= ? LIMIT 1",
        (uid, group, since),
    ).fetchone()
    return row is not None
