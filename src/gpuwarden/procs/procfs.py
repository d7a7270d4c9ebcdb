"""One process's facts read straight from its /proc files, as psutil reads them.

A snapshot asks them of every GPU process and every device-file holder, every time:
through psutil that was eleven file opens and about 200 µs a process (a Process object
that reads its stat to know its start, boot time read again, one file a fact); here it
is four files (stat, status, cmdline, statm) and two system calls. The values are psutil's
to the bit (status names, start time from the boot time and clock ticks, the name that
cmdline lengthens past 15 characters, cmdline split as it splits it), and a test holds
them to psutil's for every process of the machine it runs on."""

from __future__ import annotations

import os
from typing import NamedTuple

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# The state letter of /proc/PID/stat as psutil names it (psutil._pslinux.PROC_STATUSES).
STATUSES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "tracing-stop",
    "Z": "zombie",
    "X": "dead",
    "x": "dead",
    "K": "wake-kill",
    "W": "waking",
    "I": "idle",
    "P": "parked",
}


class Facts(NamedTuple):
    """What a snapshot reads of a live process each time."""

    uid: int  # real uid
    status: str  # psutil's name for the state
    ppid: int
    pgid: int
    start: float  # epoch seconds, psutil's create_time
    name: str  # psutil's name()
    command: str  # the command line joined by spaces, or [name] when it has none
    rss: int  # bytes resident
    cpu_time: float  # user + system seconds


def boot_time(proc: str = "/proc") -> float:
    """The boot time /proc/stat says now (``btime``; it moves when the clock is set, so
    it is read per snapshot, as psutil reads it per process)."""
    with open(f"{proc}/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def read(pid: int, boot: float, proc: str = "/proc") -> Facts:
    """The facts of ``pid``. FileNotFoundError or ProcessLookupError: it is gone;
    PermissionError: it cannot be read (another user's, under hidepid)."""
    base = f"{proc}/{pid}"
    with open(f"{base}/stat", "rb") as f:
        stat = f.read()
    right = stat.rfind(b")")
    comm = os.fsdecode(stat[stat.find(b"(") + 1 : right])
    fields = stat[right + 2 :].split()
    uid = _real_uid(base)
    try:
        with open(f"{base}/cmdline", "rb") as f:
            argv = _split_cmdline(os.fsdecode(f.read()))
    except PermissionError:  # as psutil's AccessDenied: the name stands for it
        argv = []
    with open(f"{base}/statm", "rb") as f:  # (stat's rss is the kernel's estimate)
        resident = int(f.read().split()[1])
    name = comm
    if len(comm) >= 15 and argv:  # the kernel cuts comm at 15: the command says more
        longer = os.path.basename(argv[0])
        if longer.startswith(comm):
            name = longer
    return Facts(
        uid=uid,
        status=STATUSES.get(fields[0].decode(), "?"),
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        start=float(fields[19]) / CLOCK_TICKS + boot,
        name=name,
        command=" ".join(argv) or f"[{name}]",
        rss=resident * PAGE_SIZE,
        cpu_time=int(fields[11]) / CLOCK_TICKS + int(fields[12]) / CLOCK_TICKS,
    )


def _real_uid(base: str) -> int:
    with open(f"{base}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    raise PermissionError(f"no Uid in {base}/status")


def _split_cmdline(data: str) -> list[str]:
    """psutil's reading of /proc/PID/cmdline: NUL-separated, or spaces where a process
    rewrote its title (setproctitle) without NULs."""
    if not data:
        return []
    sep = "\x00" if data.endswith("\x00") else " "
    if data.endswith(sep):
        data = data[:-1]
    argv = data.split(sep)
    if sep == "\x00" and len(argv) == 1 and " " in data:
        argv = data.split(" ")
    return argv


def state(pid: int, proc: str = "/proc") -> str | None:
    """psutil's status of ``pid``; None when it is gone or cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return STATUSES.get(fields[0].decode(), "?") if fields else None
