"""What the daemon asks of a running supervisor: is it still there, and end the job.

The supervisor is known by its identity in ``supervisor.json`` (pid, start time, start
ticks, boot id), never by its command line: a supervisor forked from the fork server
and one started as ``python -m gpuwarden.supervisor`` (or by an older gpuwarden) are
recognised alike, so a restarted daemon adopts them all. Signals go through a pidfd
opened before the identity check (``procs/identity.py``, invariant 7).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from gpuwarden.jobs.jobdir import SUPERVISOR, SupervisorHandle, read_json, read_status
from gpuwarden.procs.identity import alive as identity_alive
from gpuwarden.procs.identity import identify, running, same_boot, signal_if_same

KILL_SIGNAL = signal.SIGUSR1  # from the daemon: cancel --kill, SIGKILL the tree at once


def alive(handle: SupervisorHandle) -> bool:
    """Is this supervisor still running (same boot, same process, not a zombie)?"""
    return same_boot(handle.boot_id) and identity_alive(
        handle.pid, handle.start_time, handle.start_ticks
    )


def live_supervisors(jobs_dir: str | os.PathLike[str]) -> list[psutil.Process]:
    """The supervisors still running for job directories under ``jobs_dir`` (any depth
    of ``<job>/<attempt>/supervisor.json``), identity-checked: forked from the daemon's
    fork server, their command lines do not name their directories."""
    out = []
    for claim in sorted(Path(jobs_dir).glob(f"*/*/{SUPERVISOR}")):
        status = read_status(claim.parent).supervisor
        if status is None:
            continue
        p = identify(status.pid, status.start_time, status.start_ticks)
        if p is not None and running(p):
            out.append(p)
    return out


def _signal_identified(handle: SupervisorHandle, sig: int) -> bool:
    """Send ``sig`` to the supervisor if it is still the same running process of this
    boot (procs/identity.py: a reused pid is never hit)."""
    return same_boot(handle.boot_id) and signal_if_same(
        handle.pid, handle.start_time, sig, handle.start_ticks
    )


def cancel(jobdir: str | os.PathLike[str], kill: bool = False) -> bool:
    """Ask the job's supervisor to end the job (SIGTERM, identity-checked). True when the
    signal was sent; False when the job has ended or has no live supervisor. The
    supervisor then kills the tree and writes exit.json with reason "cancelled".
    ``kill``: the supervisor SIGKILLs the tree at once (``KILL_SIGNAL``), even one already
    in its grace; an attached job's launcher gets SIGKILL itself."""
    status = read_status(jobdir)
    if status.exit is not None or status.supervisor is None:
        return False
    if not kill:
        return _signal_identified(status.supervisor, signal.SIGTERM)
    attached = (read_json(Path(jobdir) / SUPERVISOR) or {}).get("nonce") == "attached"
    return _signal_identified(status.supervisor, signal.SIGKILL if attached else KILL_SIGNAL)
