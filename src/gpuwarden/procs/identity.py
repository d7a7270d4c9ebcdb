"""Process identity: a process is its pid *and* its start time, within one boot.

A pid alone names whichever process holds it now; after an exit the kernel hands it
to the next process. So every check that a recorded process is still "that one" goes
through here, with one rule (docs/design.md, invariant 7):

- Same start: the start clock ticks after boot (field 22 of ``/proc/PID/stat``) are
  equal where both are known: exact, and immune to wall-clock steps. Otherwise the
  epoch start times (psutil's ``create_time``) lie within ``START_TOLERANCE``: they
  are ticks plus the boot time, which the kernel reports in whole seconds and
  recomputes from the wall clock on every read, so two reads may differ by a second.
- Unreadable (access denied, e.g. ``/proc`` mounted with ``hidepid``): the process
  exists and cannot be told apart from the recorded one, so it counts as that one.
- Alive: the same process, and not a zombie (a zombie has released its memory and its
  device files; only its parent's wait() is missing).
- Boot: a record from another boot names no live process (``boot_id``).
- Signal: only through a pidfd opened *before* the identity is checked (``pin``), so a
  pid reused between the check and the signal cannot be hit; by pid right after the
  check where the kernel or Python has no pidfds."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

START_TOLERANCE = 1.0
"""Seconds: two epoch start times this close are the same process's (see above)."""

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
PROC_STAT = Path("/proc/stat")

_GONE = frozenset({"zombie", "dead"})  # psutil.STATUS_ZOMBIE, STATUS_DEAD; psutil is
# imported when called: psutil costs ~70 ms, and most importers never need it


def boot_id(path: Path = BOOT_ID_FILE, stat_path: Path = PROC_STAT) -> str:
    """This boot's id (changes on every reboot). With a process's (pid, start time) it
    tells a live process from a pid reused after a reboot. Where the kernel has no
    boot_id file, the boot time from /proc/stat (``btime:N``) serves, which also
    changes per boot; ``unknown`` only when neither is readable."""
    try:
        value = path.read_text().strip()
    except OSError:
        value = ""
    if value:
        return value
    try:
        for line in stat_path.read_text().splitlines():
            if line.startswith("btime "):
                return "btime:" + line.split()[1]
    except (OSError, IndexError):
        pass
    return "unknown"


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: the start time in clock ticks after boot, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def same_start(a: float | None, b: float | None) -> bool:
    """Do two epoch start times (psutil's ``create_time``) name the same process?"""
    return a is not None and b is not None and abs(a - b) <= START_TOLERANCE


def identify(pid: int, start_time: float | None, ticks: int | None = None) -> psutil.Process | None:
    """The process ``pid`` if it is still the one that started at ``start_time`` (and,
    when given, at ``ticks`` clock ticks after boot); None when it is gone or the pid
    now names another process. ``start_time`` None: any process with that pid."""
    import psutil

    try:
        p = psutil.Process(pid)
    except (psutil.NoSuchProcess, ValueError):
        return None
    if ticks is not None:
        now = start_ticks(pid)
        if now is not None:
            return p if now == ticks else None
    if start_time is None:
        return p
    try:
        return p if same_start(p.create_time(), start_time) else None
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return p  # exists, and cannot be told apart from the recorded process


def running(p: psutil.Process) -> bool:
    """Has this (identified) process not exited? A zombie has; unreadable counts as not."""
    import psutil

    try:
        return p.status() not in _GONE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def alive(pid: int, start_time: float | None, ticks: int | None = None) -> bool:
    """Is the process (pid, start time) still running? A zombie is not."""
    p = identify(pid, start_time, ticks)
    return p is not None and running(p)


def same_boot(recorded: str | None, current: str | None = None) -> bool:
    """Was ``recorded`` (a ``boot_id()``) taken in this boot? An unknown id on either
    side cannot tell, and counts as this boot."""
    now = boot_id() if current is None else current
    return recorded in (None, "", "unknown") or now == "unknown" or recorded == now


class Pinned:
    """One identified process to signal: through a pidfd opened before its identity was
    checked (so the signal reaches that process or none), or by pid where there is no
    pidfd. ``send`` raises psutil's NoSuchProcess or AccessDenied."""

    def __init__(self, p: psutil.Process, fd: int | None) -> None:
        self.proc, self.fd = p, fd

    def send(self, sig: int) -> None:
        import psutil

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


def pin(pid: int, start_time: float | None, ticks: int | None = None) -> Pinned | None:
    """The process (pid, start time), pinned for signals; None when it is gone or the
    pid names another process. The caller closes it."""
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except (AttributeError, OSError):  # no pidfds (old kernel or Python): by pid
        fd = None
    p = identify(pid, start_time, ticks)  # checked after the pidfd is open: it names pid
    if p is None:
        if fd is not None:
            os.close(fd)
        return None
    return Pinned(p, fd)


def signal_if_same(pid: int, start_time: float | None, sig: int, ticks: int | None = None) -> bool:
    """Send ``sig`` to the process (pid, start time) if it is still that one and has not
    exited, through a pidfd opened before the check; True when sent. A process that is
    gone, a zombie, reused or not ours to signal is False."""
    import psutil

    t = pin(pid, start_time, ticks)
    if t is None:
        return False
    try:
        if not running(t.proc):
            return False
        t.send(sig)
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    finally:
        t.close()
