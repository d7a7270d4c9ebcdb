"""Giving freed memory back to the system. A pass over 10,000 queued jobs, a page of
``ps --all``, a report: each builds tens of megabytes of objects and frees them, and
glibc's allocator keeps what was freed for the process's next allocation, so a daemon
that once saw a deep queue stayed twice its size for good. ``malloc_trim`` returns the
free pages; it costs a walk of the heap, so at most once per ``every`` seconds."""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable


class HeapTrimmer:
    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self._last = float("-inf")
        self._trim: Callable[[int], int] | None = _malloc_trim()

    @property
    def available(self) -> bool:
        """Whether this C library has ``malloc_trim`` (glibc does; musl does not)."""
        return self._trim is not None

    def maybe_trim(self) -> bool:
        """Trim if the last trim is ``every`` seconds old; whether it did."""
        now = self.clock()
        if self._trim is None or now - self._last < self.every:
            return False
        self._last = now
        self._trim(0)
        return True


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
