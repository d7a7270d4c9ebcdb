"""A process and the tree it starts: prctl settings (subreaper, parent-death signal,
name) and ending every descendant. The per-job supervisor and the Ray entrypoint both
run a command this way, so that when it ends no orphan of it escapes the clean-up."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36

_LIBC: Any = None


def prctl(option: int, arg: int | bytes) -> bool:
    """prctl(2) with one argument; False where it failed or there is no libc to ask."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        value = ctypes.c_char_p(arg) if isinstance(arg, bytes) else ctypes.c_ulong(arg)
        return (
            int(_LIBC.prctl(option, value, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)))
            == 0
        )
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphans of what this process starts become its children (not init's), so its
    descendants are the whole tree, whatever sessions they made."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def set_name(name: str) -> None:
    """Name this process for ps and top (``comm``, at most 15 bytes)."""
    prctl(PR_SET_NAME, name.encode()[:15])


def end_descendants(grace: float, kill_wait: float) -> tuple[list[int], list[int]]:
    """End every descendant of this process: SIGTERM, up to ``grace`` seconds, then
    SIGKILL and up to ``kill_wait`` more. (their pids, the pids that outlived SIGKILL)."""
    try:
        left = psutil.Process().children(recursive=True)
    except psutil.Error:
        return [], []
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _, stuck = psutil.wait_procs(alive, timeout=kill_wait)
    return [p.pid for p in left], [p.pid for p in stuck]
