"""Commands and URLs a user gives the daemon to run or call later: a service's health
check, a job's ``--notify`` command, the admin's webhook. One check of each (hostile
until shown otherwise: they run as root's guest) and one way to run a command as the
job's user, so a health check and a notification cannot differ in whose rights they
have."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import TYPE_CHECKING, Any

from gpuwarden.errors import UsageError
from gpuwarden.jobs.request import MAX_COMMAND, MAX_URL
from gpuwarden.units import format_duration

if TYPE_CHECKING:
    from gpuwarden.jobs.model import Job


def checked_command(raw: Any, label: str) -> str:
    """A shell command line to run later as the user: text, not empty, no NUL."""
    if not isinstance(raw, str) or not raw.strip() or "\0" in raw or len(raw) > MAX_COMMAND:
        raise UsageError(f"{label} must be a non-empty command of at most {MAX_COMMAND} characters")
    return raw


def checked_url(raw: Any, label: str) -> str:
    """An http:// or https:// URL without spaces or control characters."""
    if (
        not isinstance(raw, str)
        or len(raw) > MAX_URL
        or not raw.startswith(("http://", "https://"))
        or any(c.isspace() or ord(c) < 32 for c in raw)
    ):
        raise UsageError(f"{label} must be an http:// or https:// URL")
    return raw


def run_as(
    job: Job, command: str, *, timeout: float, what: str, stdin: bytes | None = None
) -> str | None:
    """Run ``/bin/sh -c command`` as the job's user (uid, gid, groups), in its working
    directory and environment with ``GPUWARDEN_JOB``, ``stdin`` on its standard input.
    None when it exits 0, else why not (``what`` names it). Its whole process group is
    killed at the timeout."""
    s = job.spec
    as_root = os.geteuid() == 0
    env = {**s.env, "GPUWARDEN_JOB": str(job.id)}
    try:
        p = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=s.cwd,
            env=env,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            user=s.uid if as_root else None,
            group=s.gid if as_root else None,
            extra_groups=list(s.groups) if as_root else None,
        )
    except OSError as e:
        return f"{what} did not start: {e}"
    try:
        _, err = p.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return f"{what} timed out after {format_duration(timeout)}"
    if p.returncode == 0:
        return None
    tail = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
    return f"{what} exited {p.returncode}" + "".join(f": {t[:200]}" for t in tail)
