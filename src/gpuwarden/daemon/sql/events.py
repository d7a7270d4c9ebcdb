"""A job's history in the store: its events read back, a note appended (an event that
changes no state), and the check that the transition events and the states agree
(invariant 2: no state change without its event, no event without its state change).
Functions of an open transaction's connection; ``Store`` owns the transactions."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Sequence

from gpuwarden.daemon.rows import json_ids
from gpuwarden.daemon.store_errors import JobNotFound
from gpuwarden.jobs import lifecycle
from gpuwarden.jobs.model import STATES, Event

# Each job's (from, to) states, in order, by job id.
Chains = dict[int, list[tuple[str | None, str]]]


def events_of(conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, list[Event]]:
    """The events of each job, oldest first."""
    out: dict[int, list[Event]] = {i: [] for i in ids}
    if not ids:
        return out
    if len(ids) == 1:
        rows = conn.execute(
            "SELECT job_id, at, kind, detail FROM events WHERE job_id = ? ORDER BY id", (ids[0],)
        )
    else:
        rows = conn.execute(
            "SELECT job_id, at, kind, detail FROM events WHERE job_id IN "
            "(SELECT value FROM json_each(?)) ORDER BY id",
            (json_ids(ids),),
        )
    for r in rows:
        out[r["job_id"]].append(Event(at=r["at"], kind=r["kind"], detail=r["detail"]))
    return out


def add_note(
    conn: sqlite3.Connection, job_id: int, kind: str, detail: str | None, now: float
) -> Event:
    """Append a note to an existing job (JobNotFound when there is none)."""
    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
        raise JobNotFound(job_id)
    append(conn, job_id, now, kind, detail)
    return Event(at=now, kind=kind, detail=detail)


def append(
    conn: sqlite3.Connection,
    job_id: int,
    at: float,
    kind: str,
    detail: str | None,
    from_state: str | None = None,
    to_state: str | None = None,
) -> None:
    """The one writer of a job's history: a submission, a transition (with its states)
    or a note, of a kind ``jobs/lifecycle.py`` names (ValueError for any other, so a
    misspelt kind cannot reach the history that ``show`` and ``logs`` read)."""
    if kind not in lifecycle.EVENTS:
        raise ValueError(f"{kind!r} is not an event (jobs/lifecycle.py)")
    conn.execute(
        "INSERT INTO events (job_id, at, kind, detail, from_state, to_state) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (job_id, at, kind, detail, from_state, to_state),
    )


def transitions(conn: sqlite3.Connection, job_id: int) -> list[tuple[str | None, str]]:
    """The (from, to) states of a job's submission and transitions, in order."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT from_state, to_state FROM events WHERE job_id = ? AND "
            "to_state IS NOT NULL ORDER BY id",
            (job_id,),
        )
    ]


def read_chains(conn: sqlite3.Connection) -> tuple[dict[int, str], Chains, list[str]]:
    """Every job's state and chain of transition events, and the events of jobs that
    do not exist (as problems)."""
    problems: list[str] = []
    jobs = {r[0]: r[1] for r in conn.execute("SELECT id, state FROM jobs")}
    chains: Chains = {i: [] for i in jobs}
    for r in conn.execute(
        "SELECT job_id, from_state, to_state FROM events WHERE to_state IS NOT NULL ORDER BY id"
    ):
        if r[0] not in chains:
            problems.append(f"event for missing job {r[0]}")
            continue
        chains[r[0]].append((r[1], r[2]))
    return jobs, chains, problems


def chain_problems(jobs: dict[int, str], chains: Chains) -> list[str]:
    """Where a job's transition events do not form a chain from its submission to its
    current state."""
    problems: list[str] = []
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
            problems.append(f"job {job_id}: state {state} but last event says {chain[-1][1]}")
    return problems
