"""MPS facts: which control daemons and servers run, for whom, with which limits, and
the names and environment variables MPS goes by, read from /proc
(``read_mps_state``). Nothing here starts or stops a daemon (``mps/control.py``)."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from gpuwarden.errors import BackendUnavailable, GpuwardenError

CONTROL_BINARY = "nvidia-cuda-mps-control"
SERVER_BINARY = "nvidia-cuda-mps-server"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
CONTROL_PIPE = "control"  # the control daemon's endpoint inside the pipe directory
PID_FILE = "nvidia-cuda-mps-control.pid"  # written there by newer drivers

ENV_PIPE_DIR = "CUDA_MPS_PIPE_DIRECTORY"
ENV_LOG_DIR = "CUDA_MPS_LOG_DIRECTORY"
ENV_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_VISIBLE = "CUDA_VISIBLE_DEVICES"
ENV_ORDER = "CUDA_DEVICE_ORDER"

# Inherited values of these would silently change which daemon or GPUs a command means.


class MpsUnavailable(BackendUnavailable):
    """The MPS tools are not installed here."""


class MpsError(GpuwardenError):
    """An MPS control daemon did not start, answer or stop as asked."""

    exit_code = 1


def same_dir(a: str, b: str) -> bool:
    """Whether two spellings name one directory (``/tmp/x/`` and ``/tmp/../tmp/x``)."""
    return os.path.realpath(a) == os.path.realpath(b)


# -- facts --------------------------------------------------------------------


@dataclass(frozen=True)
class MpsDaemon:
    """One nvidia-cuda-mps-control (kind "control") or nvidia-cuda-mps-server ("server").
    Directory and limit fields are None when the process's environ is unreadable."""

    pid: int
    kind: str
    user: str | None = None
    uid: int | None = None
    pipe_dir: str | None = None  # CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps
    log_dir: str | None = None
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES the daemon was started with
    pinned_mem_limit: str | None = None  # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, as set
    active_thread_percentage: str | None = None
    start_time: float | None = None  # with pid, the identity of the process

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "kind": self.kind,
            "user": self.user,
            "uid": self.uid,
            "pipe_dir": self.pipe_dir,
            "log_dir": self.log_dir,
            "visible_devices": self.visible_devices,
            "pinned_mem_limit": self.pinned_mem_limit,
            "active_thread_percentage": self.active_thread_percentage,
            "start_time": self.start_time,
        }


@dataclass(frozen=True)
class MpsState:
    daemons: tuple[MpsDaemon, ...] = field(default_factory=tuple)

    @property
    def controls(self) -> tuple[MpsDaemon, ...]:
        return tuple(d for d in self.daemons if d.kind == "control")

    @property
    def servers(self) -> tuple[MpsDaemon, ...]:
        return tuple(d for d in self.daemons if d.kind == "server")

    def for_pipe_dir(self, pipe_dir: str) -> MpsState:
        """Only the daemons known to use ``pipe_dir`` (unreadable ones are left out)."""
        return MpsState(
            tuple(
                d for d in self.daemons if d.pipe_dir is not None and same_dir(d.pipe_dir, pipe_dir)
            )
        )

    @property
    def pipe_dirs(self) -> tuple[str, ...]:
        """The distinct pipe directories of the control daemons, in pid order."""
        out: list[str] = []
        for d in self.controls:
            if d.pipe_dir is not None and not any(same_dir(d.pipe_dir, o) for o in out):
                out.append(d.pipe_dir)
        return tuple(out)


def daemon_kind(name: str | None, cmdline: Sequence[str] | None) -> str | None:
    """ "control", "server" or None, from argv[0] first (the kernel truncates the process
    name to 15 characters, which makes both read ``nvidia-cuda-mps``), then the name."""
    candidates = []
    if cmdline:
        candidates.append(os.path.basename(cmdline[0]))
    if name:
        candidates.append(name)
    for c in candidates:
        if c == CONTROL_BINARY:
            return "control"
        if c == SERVER_BINARY:
            return "server"
    return None


def daemon_from_env(
    pid: int,
    kind: str,
    env: Mapping[str, str] | None,
    *,
    user: str | None = None,
    uid: int | None = None,
    start_time: float | None = None,
) -> MpsDaemon:
    """An MpsDaemon from its environment; unset directories mean MPS's defaults,
    an unreadable environment (``None``) means unknown."""
    if env is None:
        return MpsDaemon(pid=pid, kind=kind, user=user, uid=uid, start_time=start_time)
    return MpsDaemon(
        pid=pid,
        kind=kind,
        user=user,
        uid=uid,
        pipe_dir=env.get(ENV_PIPE_DIR) or DEFAULT_PIPE_DIR,
        log_dir=env.get(ENV_LOG_DIR) or DEFAULT_LOG_DIR,
        visible_devices=env.get(ENV_VISIBLE),
        pinned_mem_limit=env.get(ENV_MEM_LIMIT),
        active_thread_percentage=env.get(ENV_THREADS),
        start_time=start_time,
    )


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def read_mps_state(processes: Iterable[psutil.Process] | None = None) -> MpsState:
    """Scan /proc for MPS control daemons and servers. Reading another user's environ
    needs root; without it the directory and limit fields stay None."""
    procs = psutil.process_iter() if processes is None else processes
    found: list[MpsDaemon] = []
    for p in procs:
        try:
            with p.oneshot():
                name = p.name()
                try:
                    cmdline: list[str] | None = p.cmdline()
                except (psutil.AccessDenied, psutil.ZombieProcess):
                    cmdline = None
                kind = daemon_kind(name, cmdline)
                if kind is None:
                    continue
                uid = p.uids().real
                start = p.create_time()
            try:
                env: Mapping[str, str] | None = p.environ()
            except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
                env = None
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found.append(
            daemon_from_env(p.pid, kind, env, user=_user_name(uid), uid=uid, start_time=start)
        )
    found.sort(key=lambda d: (d.kind != "control", d.pid))
    return MpsState(tuple(found))
