"""Drained GPUs in the store: an admin's word that no new job is placed on a GPU until
it is undrained (``gpuwarden gpu drain``), kept across restarts. Functions of an open
transaction's connection; ``Store`` owns the transactions."""

from __future__ import annotations

import sqlite3
from typing import Any


def drain(conn: sqlite3.Connection, gpu: int, reason: str | None, by: str, now: float) -> bool:
    """Mark GPU ``gpu`` drained; False when it was already (its reason and who drained
    it are then updated)."""
    had = conn.execute("SELECT 1 FROM drains WHERE gpu = ?", (gpu,)).fetchone()
    conn.execute(
        "INSERT OR REPLACE INTO drains (gpu, reason, by_user, at) VALUES (?, ?, ?, ?)",
        (gpu, reason, by, now),
    )
    return had is None


def undrain(conn: sqlite3.Connection, gpu: int) -> bool:
    """Let placement use GPU ``gpu`` again; False when it was not drained."""
    return conn.execute("DELETE FROM drains WHERE gpu = ?", (gpu,)).rowcount > 0


def drains(conn: sqlite3.Connection) -> dict[int, dict[str, Any]]:
    """GPU index -> {reason, by, at} of every drained GPU."""
    return {
        int(r[0]): {"reason": r[1], "by": r[2], "at": float(r[3])}
        for r in conn.execute("SELECT gpu, reason, by_user, at FROM drains ORDER BY gpu")
    }
