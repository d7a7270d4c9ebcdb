"""Jobs another launcher starts (a Ray node's gpuwarden entrypoint): the daemon queues,
places and watches them like its own, but the launcher starts the command and reports
its end.

The launcher takes the supervisor's place in the job directory: at submit the daemon
writes ``supervisor.json`` naming the calling process (its pid from SO_PEERCRED, with
its start time, so a reused pid is never taken for it), and the launcher's reports
become ``child.json`` and ``exit.json``. Everything that reads a job directory — the
scheduling loop, recovery after a restart, cancel (SIGTERM to the launcher), the
memory-back check of invariant 5 — then works unchanged; a launcher that dies without
reporting is a lost supervisor, and its job fails with its memory checked."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from gpuwarden.errors import PermissionDenied, UsageError
from gpuwarden.jobs.jobdir import (
    CHILD,
    EXIT,
    STDERR,
    ChildInfo,
    ExitInfo,
    SupervisorHandle,
    read_status,
    write_child,
    write_claim,
    write_exit,
)
from gpuwarden.procs.identity import boot_id, start_ticks
from gpuwarden.supervisor.control import alive

if TYPE_CHECKING:
    from gpuwarden.daemon.auth import Caller

MAX_OUTPUT = 64 << 10  # the tail of the output a launcher may hand over (OOM detection)
# What cannot apply to a job the daemon does not start or stop itself.
NOT_FOR_ATTACHED = ("mps", "checkpoint", "requeue_on_reboot", "timeout", "after", "key", "retries")


def refuse_clashes(body: Mapping[str, Any]) -> None:
    """An attached job is started, retried and timed by its launcher."""
    clash = [f for f in NOT_FOR_ATTACHED if body.get(f) not in (None, False, 0, [])]
    if clash:
        raise UsageError(
            f"an attached job is started and ended by its launcher: "
            f"{', '.join(clash)} cannot apply to it"
        )


def claim(jobdir: Path, job_id: int, caller: Caller) -> None:
    """Name the caller's process (the one that attached the job) as the job's supervisor,
    by the identity read when its connection was accepted (``auth.identify``): read now,
    the pid could be another process's."""
    if caller.pid <= 0 or caller.start_time is None:
        raise UsageError(
            f"the attaching process {caller.pid} is gone (or not visible from the daemon)"
        )
    jobdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_claim(
        jobdir,
        job_id,
        SupervisorHandle(
            pid=caller.pid,
            start_time=caller.start_time,
            boot_id=boot_id(),
            start_ticks=caller.start_ticks,
        ),
        "attached",
    )


def live_launcher(jobdir: Path) -> SupervisorHandle | None:
    """The launcher named in the job directory, if it still runs."""
    handle = read_status(jobdir).supervisor
    return handle if handle is not None and alive(handle) else None


def check_reporter(jobdir: Path, job_id: int, caller: Caller) -> None:
    """Only the process that attached the job reports on it (the same pid and start)."""
    handle = read_status(jobdir).supervisor
    same = (
        handle is not None
        and handle.pid == caller.pid
        and (
            None in (handle.start_ticks, caller.start_ticks)
            or handle.start_ticks == caller.start_ticks
        )
    )
    if handle is None or not same or not alive(handle):
        raise PermissionDenied(
            f"only the process that attached job {job_id} may report its start and end"
        )


def record_start(jobdir: Path, job_id: int, launcher: int, body: Any) -> int:
    """``child.json`` for the command the launcher started (one of its descendants)."""
    if not isinstance(body, Mapping) or set(body) != {"pid"}:
        raise UsageError('the body must be {"pid": N}')
    pid = body["pid"]
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 1 << 31:
        raise UsageError("pid must be a process id")
    try:
        proc = psutil.Process(pid)
        ancestors = {p.pid for p in proc.parents()}
        start = proc.create_time()
    except psutil.Error:
        raise UsageError(f"process {pid} is gone") from None
    if launcher not in ancestors:
        raise PermissionDenied(
            f"process {pid} was not started by the process that attached job {job_id}"
        )
    try:
        write_child(
            jobdir,
            ChildInfo(
                pid=pid, start_time=start, start_ticks=start_ticks(pid), started_at=time.time()
            ),
        )
    except FileExistsError:
        raise UsageError(f"job {job_id}'s start was reported already") from None
    return pid


def record_end(jobdir: Path, job_id: int, body: Any) -> None:
    """``exit.json`` (and the output's tail, where the loop looks for a CUDA OOM)."""
    if not isinstance(body, Mapping):
        raise UsageError("the body must be a JSON object")
    unknown = sorted(
        set(body) - {"exit_code", "signal", "reason", "tree_clean", "survivors", "output"}
    )
    if unknown:
        raise UsageError(f"unknown field(s): {', '.join(unknown)}")
    code, sig = body.get("exit_code"), body.get("signal")
    for label, v in (("exit_code", code), ("signal", sig)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 255):
            raise UsageError(f"{label} must be an integer from 0 to 255, or null")
    reason = body.get("reason", "exited")
    if not isinstance(reason, str) or not reason or len(reason) > 500:
        raise UsageError("reason must be a non-empty string of at most 500 characters")
    clean = body.get("tree_clean", True)
    if not isinstance(clean, bool):
        raise UsageError("tree_clean must be true or false")
    survivors = body.get("survivors", [])
    if not isinstance(survivors, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and 0 < p < 1 << 31 for p in survivors
    ):
        raise UsageError("survivors must be a list of process ids")
    output = body.get("output", "")
    if not isinstance(output, str):
        raise UsageError("output must be a string")
    started = (jobdir / CHILD).exists()
    if (jobdir / EXIT).exists():
        raise UsageError(f"job {job_id}'s end was reported already")
    if output:
        data = output.encode(errors="replace")[-MAX_OUTPUT:]
        _write_output(jobdir / STDERR, data)
    try:
        write_exit(
            jobdir,
            job_id,
            ExitInfo(
                exit_code=code,
                signal=sig,
                reason=reason,
                ended_at=time.time(),
                tree_clean=clean,
                survivors=tuple(survivors),
                started=started,
            ),
        )
    except FileExistsError:
        raise UsageError(f"job {job_id}'s end was reported already") from None


def _write_output(path: Path, data: bytes) -> None:
    """The output tail, as the job's stderr (what ``logs`` shows for an attached job)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
