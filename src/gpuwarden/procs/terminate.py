"""Signal a process by identity (pid + start time), TERM then KILL after a grace period.

Identity and signalling follow procs/identity.py: where the kernel has pidfds, the
signal goes through one opened before the identity is checked, so a pid that is reused
between the check and the signal cannot be hit."""

from __future__ import annotations

import signal
import time

import psutil

# Identity (pid + start time) and the pidfd pin: one rule, docs/design.md invariant 7.
from gpuwarden.procs.identity import identify as _same
from gpuwarden.procs.identity import pin as _target
from gpuwarden.procs.identity import same_start as same_start  # for callers of this module


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


def signal_parent(
    parent: int, child: int, wait: float = 2.0, child_start: float | None = None
) -> str:
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
