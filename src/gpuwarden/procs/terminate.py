"""Signal a process by identity (pid + start time), TERM then KILL after a grace period."""

from __future__ import annotations

import os
import signal
import time

import psutil


def _same(pid: int, start_time: float | None) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        if start_time is not None and abs(p.create_time() - start_time) > 0.01:
            return None  # the pid was reused by another process: leave it alone
        return p
    except (psutil.NoSuchProcess, ValueError):
        return None


def _exited(p: psutil.Process, timeout: float) -> bool:
    """Wait until ``p`` has exited. A zombie has exited too: only its parent's wait() is
    missing, and its memory and device files are already released."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def terminate(pid: int, start_time: float | None, grace: float = 5.0) -> str:
    """Returns gone (already), terminated (on SIGTERM), killed (needed SIGKILL), denied,
    or stuck (still there after SIGKILL, e.g. in uninterruptible sleep in the driver)."""
    p = _same(pid, start_time)
    if p is None:
        return "gone"
    try:
        p.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        return "gone"
    except psutil.AccessDenied:
        return "denied"
    if _exited(p, grace):
        return "terminated"
    try:
        p.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        return "terminated"
    return "killed" if _exited(p, 5.0) else "stuck"


def signal_parent(parent: int, child: int, wait: float = 2.0) -> str:
    """Nudge a parent to reap its zombie child; returns reaped, still_zombie or denied."""
    try:
        os.kill(parent, signal.SIGCHLD)
    except ProcessLookupError:
        return "reaped" if not psutil.pid_exists(child) else "still_zombie"
    except PermissionError:
        return "denied"
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not psutil.pid_exists(child):
            return "reaped"
        time.sleep(0.05)
    return "still_zombie"
