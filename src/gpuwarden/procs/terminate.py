"""Signal a process by identity (pid + start time), TERM then KILL after a grace period.

Where the kernel has pidfds, the signal goes through one opened before the identity is
checked: a pid that is reused between the check and the signal cannot be hit."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

SAME_START = 0.01  # seconds: two start times this close are the same process's


def same_start(a: float | None, b: float | None) -> bool:
    """Do two start times (psutil's create_time) name the same process?"""
    return a is not None and b is not None and abs(a - b) <= SAME_START


def _same(pid: int, start_time: float | None) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        if start_time is not None and not same_start(p.create_time(), start_time):
            return None  # the pid was reused by another process: leave it alone
        return p
    except (psutil.NoSuchProcess, ValueError):
        return None


class _Target:
    """One process to signal: through a pidfd opened before its identity was checked
    (so the signal reaches that process or none), or by pid where there is no pidfd."""

    def __init__(self, p: psutil.Process, fd: int | None) -> None:
        self.proc, self.fd = p, fd

    def send(self, sig: int) -> None:
        if self.fd is None:
            self.proc.send_signal(sig)
            return
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            raise psutil.NoSuchProcess(self.proc.pid) from None
        except PermissionError:
            raise psutil.AccessDenied(self.proc.pid) from None

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _target(pid: int, start_time: float | None) -> _Target | None:
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except (AttributeError, OSError):  # no pidfds (old kernel or Python): by pid
        fd = None
    p = _same(pid, start_time)  # checked after the pidfd is open: it names this process
    if p is None:
        if fd is not None:
            os.close(fd)
        return None
    return _Target(p, fd)


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
    t = _target(pid, start_time)
    if t is None:
        return "gone"
    try:
        try:
            t.send(signal.SIGTERM)
        except psutil.NoSuchProcess:
            return "gone"
        except psutil.AccessDenied:
            return "denied"
        if _exited(t.proc, grace):
            return "terminated"
        try:
            t.send(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return "terminated"
        return "killed" if _exited(t.proc, 5.0) else "stuck"
    finally:
        t.close()


def signal_parent(parent: int, child: int, wait: float = 2.0,
                  child_start: float | None = None) -> str:
    """Nudge a parent to reap its zombie child; returns reaped, still_zombie, denied, or
    parent_changed. The parent is signalled only while the zombie (pid and, when given,
    start time) still names it as its parent, through a pidfd opened before that check:
    a parent that died and whose pid went to another process is never hit."""
    t = _target(parent, None)
    if t is None:
        return "reaped" if _same(child, child_start) is None else "still_zombie"
    try:
        zombie = _same(child, child_start)
        if zombie is None:
            return "reaped"
        try:
            if zombie.ppid() != parent:
                return "parent_changed"
        except psutil.NoSuchProcess:
            return "reaped"
        try:
            t.send(signal.SIGCHLD)
        except psutil.NoSuchProcess:
            return "reaped" if _same(child, child_start) is None else "still_zombie"
        except psutil.AccessDenied:
            return "denied"
    finally:
        t.close()
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if _same(child, child_start) is None:
            return "reaped"
        time.sleep(0.05)
    return "still_zombie"
