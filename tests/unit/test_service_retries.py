"""How many OOM retries a submitted job gets (service.spec_from_request): the daemon's
``oom_retries`` for a job with a budget that does not say, what it says otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.submission import spec_from_request
from gpuwarden.errors import UsageError

ME = Caller(pid=1, uid=1000, gid=1000, user="alice", groups=(1000,))


def retries(oom_retries: int = 1, **body: Any) -> int:
    spec, _ = spec_from_request(
        {"command": ["true"], "cwd": "/", "env": {}, **body}, ME, 2, oom_retries=oom_retries
    )
    return spec.retries


def test_a_job_with_a_budget_gets_the_daemons_retries_unless_it_says() -> None:
    assert retries(mem="4G") == 1
    assert retries(3, mem="4G") == 3
    assert retries(mem="auto", name="train") == 1
    assert retries(mem="4G", retries=0) == 0  # --retries 0 turns it off
    assert retries(mem="4G", retries=2) == 2
    assert retries(mem="4G", retries=None) == 1  # null reads as absent


def test_a_whole_gpu_job_has_no_bigger_budget_to_retry_with() -> None:
    assert retries() == 0
    assert retries(retries=2) == 2  # asked for: the retry says why it cannot happen


def test_bad_retries_are_one_clear_error() -> None:
    for bad in (-1, 101, "1", True):
        with pytest.raises(UsageError, match="retries must be"):
            retries(mem="4G", retries=bad)
