"""Log an error that repeats once per interval, not once per occurrence: a client that
opens thousands of connections, or a pass failing with EMFILE ten times a second, must
not fill daemon.log (it grew 3.7 MB/s). The first occurrence is logged at once; the
next one logged after the interval says how many were left out meanwhile."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

INTERVAL = 60.0
MAX_KEYS = 1024  # keys come from the code, some with a uid: bounded all the same


class Repeats:
    def __init__(
        self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, list[float]] = {}  # key -> [last logged at, left out since]

    def note(self, key: str) -> str | None:
        """None when ``key`` was let through less than ``interval`` ago (it is counted);
        else what to add to its line: "" or how often it was left out meanwhile."""
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.interval:
                seen[1] += 1
                return None
            self._seen.pop(key, None)
            self._seen[key] = [now, 0]
            while len(self._seen) > MAX_KEYS:
                del self._seen[next(iter(self._seen))]
        if seen is None or not seen[1]:
            return ""
        return f" (repeated {int(seen[1])} times in the last {now - seen[0]:.0f} s)"

    def log(
        self,
        logger: logging.Logger,
        level: int,
        key: str,
        msg: str,
        *args: object,
        exc_info: bool = False,
    ) -> bool:
        """Log ``msg`` unless ``key`` was logged less than ``interval`` ago (then only
        count it); True when it was logged."""
        tail = self.note(key)
        if tail is None:
            return False
        logger.log(level, msg + tail.replace("%", "%%"), *args, exc_info=exc_info)
        return True


REPEATS = Repeats()


def log_repeated(
    logger: logging.Logger, level: int, key: str, msg: str, *args: object, exc_info: bool = False
) -> bool:
    """The daemon's one way to log an error that may repeat (see ``Repeats``)."""
    return REPEATS.log(logger, level, key, msg, *args, exc_info=exc_info)


def loop_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: asyncio's own lines ("socket.accept() out of
    system resource", EMFILE) through ``REPEATS`` too."""
    exc = context.get("exception")
    key = f"loop:{context.get('message')}:{type(exc).__name__}:{getattr(exc, 'errno', '')}"
    tail = REPEATS.note(key)
    if tail is None:
        return
    loop.default_exception_handler({**context, "message": f"{context.get('message')}{tail}"})
