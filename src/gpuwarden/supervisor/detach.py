"""Becoming the supervisor: from the process that was asked to start one (``python -m
gpuwarden.supervisor`` or the fork server), fork, setsid, fork, and wait for the
supervisor's word that it owns the job directory.

The supervisor is then nobody's child but init's (or the nearest subreaper's), so it
outlives the daemon; the asking process exits or goes on, with no child left behind.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from gpuwarden.jobs.jobdir import (
    CHILD,
    EXIT,
    LOG,
    SUPERVISOR,
    SupervisorError,
    SupervisorSpec,
    load_spec,
)
from gpuwarden.procs.tree import set_name
from gpuwarden.supervisor.shim import Supervisor


def refuse_if_started(jobdir: Path) -> None:
    """One supervisor per job directory, ever: refuse one that has (had) a supervisor."""
    for name in (SUPERVISOR, CHILD, EXIT):
        if (jobdir / name).exists():
            raise SupervisorError(
                f"{jobdir / name} exists: this job has (had) a supervisor; "
                "refusing to start it again"
            )


def daemonize(jobdir: Path, spec: SupervisorSpec, nonce: str | None) -> int:
    """fork, setsid, fork: the supervisor is nobody's child but init's (or the nearest
    subreaper's). This process waits for the intermediate one and for the supervisor's
    word that it owns the directory, then exits: 0, or 2 with the reason on stderr."""
    rc, err = detach(jobdir, spec, nonce)
    if err:
        print(err, file=sys.stderr)
    return rc


def detach(jobdir: Path, spec: SupervisorSpec, nonce: str | None) -> tuple[int, str]:
    """Start the detached supervisor for ``jobdir`` from this process (fork, setsid,
    fork) and wait until it owns the directory. Returns (0, "") or (2, the reason); the
    caller goes on as before, with no child of its own left behind."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _run_detached(jobdir, spec, nonce, r, w)
    os.close(w)
    os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    try:
        reply = json.loads(b"".join(chunks).decode(errors="replace").splitlines()[0])
    except (ValueError, IndexError):
        reply = {}
    if isinstance(reply, dict) and reply.get("ok") is True:
        return 0, ""
    why = reply.get("error") if isinstance(reply, dict) else None
    return 2, f"gpuwarden supervisor: {why or 'the supervisor died while starting'}"


def _run_detached(
    jobdir: Path, spec: SupervisorSpec, nonce: str | None, r: int, w: int
) -> NoReturn:
    """In the first child: new session, fork the supervisor, exit."""
    code = 1
    try:
        os.close(r)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        os.chdir("/")
        set_name(f"gw-sup-{spec.job}")
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(jobdir / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        code = Supervisor(jobdir, spec, nonce).run(w)
    except BaseException:
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
    os._exit(code)


def start(jobdir: str | os.PathLike[str], nonce: str | None) -> tuple[int, str]:
    """What ``python -m gpuwarden.supervisor --nonce N JOBDIR`` does, callable from
    a process that has this module imported already (the daemon's fork server)."""
    d = Path(jobdir).resolve()
    try:
        spec = load_spec(d)
        refuse_if_started(d)
    except SupervisorError as e:
        return 2, f"gpuwarden supervisor: {e}"
    return detach(d, spec, nonce)
