"""Starting a supervisor, the launcher's side: the spec a job runs by, a fresh
interpreter running ``python -m gpuwarden.supervisor``, and the check that the
supervisor which claimed the directory is the one started (its nonce).

The daemon's fork server (``forkserver.py``) starts supervisors faster and reports
back through ``started`` and ``abandon_start`` too; this module is its fallback.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuwarden.jobs.jobdir import (
    DEFAULT_GRACE,
    SUPERVISOR,
    SupervisorError,
    SupervisorHandle,
    SupervisorSpec,
    read_json,
    read_status,
)
from gpuwarden.launch import LaunchPlan
from gpuwarden.supervisor.control import cancel

MODULE = "gpuwarden.supervisor"  # what ``python -m`` runs to start one


class NotStarted(SupervisorError):
    """The start failed and it is proven that no supervisor runs the directory: the
    launcher voided it (its own claim, which a late supervisor cannot make) before any
    supervisor claimed it. Nothing of the job ran, so it may be queued again."""


def spec_from_plan(
    job: int,
    plan: LaunchPlan,
    command: Sequence[str],
    *,
    cwd: str,
    uid: int,
    gid: int,
    groups: Sequence[int] = (),
    timeout: float | None = None,
    grace: float = DEFAULT_GRACE,
) -> SupervisorSpec:
    """The spec for running ``command`` as ``plan_launch`` planned it: its environment
    (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, the cap hook), CPU set and numactl prefix."""
    cmd = tuple(command)
    n = len(plan.argv) - len(cmd)
    if not cmd or n < 0 or plan.argv[n:] != cmd:
        raise ValueError("the plan's argv does not end with the command")
    return SupervisorSpec(
        job=job,
        argv=cmd,
        env=dict(plan.env),
        cwd=cwd,
        uid=uid,
        gid=gid,
        groups=tuple(groups),
        cpus=plan.cpus,
        timeout=timeout,
        grace=grace,
        numactl_prefix=plan.argv[:n],
    )


def spawn_supervisor(
    jobdir: str | os.PathLike[str],
    python: str = sys.executable,
    *,
    timeout: float = 10.0,
    env: Mapping[str, str] | None = None,
) -> SupervisorHandle:
    """Start the supervisor for ``jobdir`` (spec.json written already) and return its
    identity. The process started here exits as soon as the detached supervisor has
    claimed the directory, and is reaped here: nothing is left as the caller's zombie.
    Raises ``SupervisorError`` (bad spec, job already started, no start in time)."""
    d = Path(jobdir).resolve()
    nonce = secrets.token_hex(8)
    proc = subprocess.Popen(
        [python, "-m", MODULE, "--nonce", nonce, str(d)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        close_fds=True,
        env=None if env is None else dict(env),
    )
    assert proc.stderr is not None
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        proc.stderr.close()
        abandon_start(d, nonce)
        raise SupervisorError(f"the supervisor for {d} did not start within {timeout:g}s") from None
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    return started(d, nonce, rc, err)


def started(jobdir: Path, nonce: str, rc: int, err: str) -> SupervisorHandle:
    """The identity of the supervisor that claimed ``jobdir`` with ``nonce``, given how
    the process that started it ended (exit status ``rc``, its stderr ``err``)."""
    err = err.strip()
    if rc != 0:
        last = err.splitlines()[-1] if err else f"exit status {rc}"
        raise SupervisorError(last.removeprefix("gpuwarden supervisor: "))
    data = read_json(jobdir / SUPERVISOR)
    status = read_status(jobdir).supervisor
    if data is None or status is None or data.get("nonce") != nonce:
        raise SupervisorError(f"{jobdir / SUPERVISOR} was not written by the supervisor started")
    return status


def abandon_start(jobdir: Path, nonce: str) -> None:
    """The launcher gave up on a start: if the supervisor claimed the directory anyway,
    make sure the job does not run unnoticed."""
    data = read_json(jobdir / SUPERVISOR)
    if data is not None and data.get("nonce") == nonce:
        cancel(jobdir)
