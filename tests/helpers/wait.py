"""The one wait loop of the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    pred: Any,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str | Callable[[Any], str] = "the condition",
    until: Callable[[Any], Any] | None = None,
) -> Any:
    """``pred()``'s first true value, asked every ``interval`` seconds: the one wait loop
    of the tests. Past ``timeout`` it fails, naming ``what`` it waited for.

    With ``until``, ``pred()`` is what is observed and ``until(value)`` says whether it
    holds; the value that held is returned. ``what`` may also be a function of the last
    value observed, returning the whole failure message."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if until(value) if until is not None else value:
            return value
        if time.monotonic() > deadline:
            if callable(what):
                raise AssertionError(what(value))
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
