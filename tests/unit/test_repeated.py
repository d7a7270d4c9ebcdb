"""A repeated error is logged once per interval, with how often it was left out."""

from __future__ import annotations

import logging

import pytest

from gpuwarden.daemon.repeated import Repeats


def test_a_repeated_error_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    repeats = Repeats(interval=60, clock=lambda: now[0])
    log = logging.getLogger("gpuwarden.test")
    with caplog.at_level(logging.WARNING, logger="gpuwarden.test"):
        for _ in range(3121):
            repeats.log(log, logging.WARNING, "accept", "accept failed: %s", "EMFILE")
            now[0] += 0.01
        repeats.log(log, logging.WARNING, "other", "another error")
        now[0] = 61.0
        repeats.log(log, logging.WARNING, "accept", "accept failed: %s", "EMFILE")
    assert [r.getMessage() for r in caplog.records] == [
        "accept failed: EMFILE",
        "another error",
        "accept failed: EMFILE (repeated 3120 times in the last 61 s)",
    ]
