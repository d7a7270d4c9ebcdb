"""What the daemon measured and the store keeps beside the jobs: memory samples of
each GPU over time (the web page's history, ``daemon/history.py``) and the CUDA
context's size per GPU model and driver (``sched/context.py``). Functions of an open
transaction's connection; ``Store`` owns the transactions."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwarden.daemon.history import GpuSample


def record_samples(
    conn: sqlite3.Connection, samples: Iterable[GpuSample], *, keep: float, now: float
) -> None:
    """Store one pass's samples and drop those older than ``keep`` seconds."""
    conn.executemany(
        "INSERT OR REPLACE INTO samples (gpu, ts, idx, total, used, leaked, parts) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (
                s.uuid,
                s.ts,
                s.index,
                s.total,
                s.used,
                s.leaked,
                json.dumps(s.parts(), separators=(",", ":")),
            )
            for s in samples
        ],
    )
    conn.execute("DELETE FROM samples WHERE ts < ?", (int(now - keep),))


def samples_query(since: float, until: float | None, job_id: int | None) -> tuple[str, list[Any]]:
    """The query of samples from ``since`` (to ``until``; with ``job_id`` only those
    in which that job held memory), oldest first, and its arguments."""
    sql = "SELECT ts, gpu, idx, total, used, leaked, parts FROM samples WHERE ts >= ?"
    args: list[Any] = [int(since)]
    if until is not None:
        sql += " AND ts <= ?"
        args.append(int(until))
    if job_id is not None:
        sql += " AND json_extract(parts, ?) IS NOT NULL"
        args.append(f'$.j."{int(job_id)}"')
    return sql + " ORDER BY ts, idx", args


def read_samples(rows: Iterable[sqlite3.Row]) -> list[GpuSample]:
    """The samples a query of ``samples_query`` found."""
    from gpuwarden.daemon.history import GpuSample

    return [GpuSample.from_row(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in rows]


def add_context_sample(
    conn: sqlite3.Connection, model: str, driver: str, nbytes: int, now: float
) -> None:
    """Keep one measurement of the CUDA context, and only the latest ``SAMPLES_KEPT``
    of its GPU model and driver."""
    from gpuwarden.sched.context import SAMPLES_KEPT

    conn.execute(
        "INSERT INTO contexts (model, driver, at, bytes) VALUES (?, ?, ?, ?)",
        (model, driver, now, int(nbytes)),
    )
    conn.execute(
        "DELETE FROM contexts WHERE model = ? AND driver = ? AND rowid NOT IN "
        "(SELECT rowid FROM contexts WHERE model = ? AND driver = ? "
        "ORDER BY at DESC LIMIT ?)",
        (model, driver, model, driver, SAMPLES_KEPT),
    )


def context_samples(conn: sqlite3.Connection) -> dict[tuple[str, str], list[int]]:
    """Every kept CUDA context measurement, oldest first, by (GPU model, driver)."""
    rows = conn.execute("SELECT model, driver, bytes FROM contexts ORDER BY at")
    out: dict[tuple[str, str], list[int]] = {}
    for model, driver, nbytes in rows:
        out.setdefault((str(model), str(driver)), []).append(int(nbytes))
    return out
