"""PID namespaces: which pids NVML may report that this /proc cannot see."""

from __future__ import annotations

import functools
import os


def read_nspid(pid: int | str, proc: str = "/proc") -> tuple[int, ...] | None:
    """The NSpid chain of a process (outermost namespace first), None when unreadable."""
    try:
        with open(f"{proc}/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


@functools.cache
def in_child_pid_namespace() -> bool:
    """True when this process runs inside a container's PID namespace: then the driver
    reports host pids that this /proc cannot show. Asked once: a process never leaves
    its PID namespace (and a fork is born in it)."""
    chain = read_nspid("self")
    if chain is not None and len(chain) > 1:
        return True
    try:
        return os.readlink("/proc/self/ns/pid") != os.readlink("/proc/1/ns/pid")
    except OSError:
        return False


def pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max", encoding="utf-8") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 4194304


def inner_pid_map(proc: str = "/proc") -> dict[int, list[tuple[int, int]]]:
    """Map an inner-namespace pid to the (host pid, depth) pairs that carry it, for
    telling which container a pid the driver reports in a container's numbering belongs to."""
    out: dict[int, list[tuple[int, int]]] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        chain = read_nspid(name, proc)
        if chain and len(chain) > 1:
            for depth, inner in enumerate(chain[1:], start=1):
                out.setdefault(inner, []).append((chain[0], depth))
    return out
