"""A submit request as the daemon reads it (``service.spec_from_request``): every field
hostile until checked, each refusal one clear line, identity from the caller alone."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.submission import spec_from_request
from gpuwarden.errors import UsageError

ME = Caller(pid=1, uid=1000, gid=1000, user="alice", groups=(1000, 27))
GiB = 1 << 30


def submit(capacities: dict[int, int] | None = None, **body: Any) -> Any:
    spec, _ = spec_from_request(
        {"command": ["python", "train.py"], "cwd": "/home/a", "env": {"PATH": "/usr/bin"}, **body},
        ME,
        4,
        capacities=capacities,
        oom_retries=2,
        max_grace=600.0,
    )
    return spec


def test_a_plain_request_and_its_defaults() -> None:
    spec = submit()
    assert spec.command == ("python", "train.py") and spec.cwd == "/home/a"
    assert (spec.user, spec.uid, spec.gid, spec.groups) == ("alice", 1000, 1000, (1000, 27))
    assert spec.mem is None and spec.gpus == 1 and spec.priority == 0
    assert spec.qos == "burstable" and spec.retries == 0  # a whole GPU cannot grow
    assert not spec.exclusive and not spec.mps and spec.timeout is None


def test_identity_comes_from_the_caller_never_the_body() -> None:
    with pytest.raises(UsageError, match="unknown field"):
        submit(user="root")
    with pytest.raises(UsageError, match="unknown field"):
        submit(uid=0)


def test_sizes_fractions_and_durations() -> None:
    assert submit(mem="14G").mem == 14 * GiB
    assert submit(mem="14G").retries == 2  # the daemon's oom_retries
    assert submit(mem="0.5", capacities={0: 80 * GiB, 1: 40 * GiB}).mem == 20 * GiB
    assert submit(mem="0.5", gpu_ids=[0], capacities={0: 80 * GiB, 1: 40 * GiB}).mem == 40 * GiB
    assert submit(timeout="2h").timeout == 7200.0
    assert submit(grace=0).grace == 0.0
    assert submit(mem="auto", name="train").mem_auto


BAD: list[tuple[dict[str, Any], str]] = [
    ({"command": []}, "command must not be empty"),
    ({"command": [""]}, "command must not be empty"),
    ({"command": "python train.py"}, "command"),
    ({"command": ["a\0b"]}, "NUL"),
    ({"cwd": "relative"}, "cwd must be an absolute path"),
    ({"env": {"A": 1}}, "env must be an object of strings"),
    ({"env": {"A=B": "x"}}, "invalid environment variable"),
    ({"mem": "lots"}, "mem"),
    ({"mem": -1}, "mem"),
    ({"mem": "0.5"}, "needs the daemon's view of the GPUs"),
    ({"mem": 0.5}, "a fraction needs a known total"),
    ({"mem": "auto"}, "give one"),
    ({"mem_limit": "20G"}, "mem_limit needs mem"),
    ({"mem": "20G", "mem_limit": "10G"}, "at least mem"),
    ({"mem": "20G", "mem_limit": "30G", "qos": "guaranteed"}, "capped at its request"),
    ({"qos": "platinum"}, "qos must be guaranteed, burstable or besteffort"),
    ({"qos": "besteffort", "exclusive": True}, "besteffort job cannot hold GPUs"),
    ({"grace": "2h"}, "at most 600s"),
    ({"grace": -1}, "grace"),
    ({"timeout": 0}, "timeout"),
    ({"sm_percent": 50}, "sm_percent needs mps"),
    ({"mps": True, "mem": "10G", "sm_percent": 0}, "sm_percent"),
    ({"mps": True}, "mps needs mem"),
    ({"retries": 101}, "retries must be"),
    ({"retries": True}, "retries must be"),
    ({"cpus": 8, "no_numa": True}, "choose one"),
    ({"mig": "huge"}, "not a MIG profile"),
    ({"mig": "1g.10gb", "mps": True, "mem": "5G"}, "no MPS server on a MIG instance"),
    ({"gpus": 0}, "gpus"),
    ({"gpus": 65}, "gpus"),
    ({"gpu_ids": []}, "non-empty list"),
    ({"gpu_ids": [4]}, "no GPU with index 4"),
    ({"priority": 1001}, "priority"),
    ({"priority": "high"}, "priority"),
    ({"name": ""}, "name must be a non-empty string"),
    ({"key": "k" * 201}, "key must be"),
    ({"exclusive": "yes"}, "exclusive must be true or false"),
    ({"attach": ""}, "attach must be"),
    ({"surprise": 1}, "unknown field(s): surprise"),
]


@pytest.mark.parametrize(("body", "says"), BAD, ids=[next(iter(b)) for b, _ in BAD])
def test_a_bad_request_is_one_clear_line(body: dict[str, Any], says: str) -> None:
    with pytest.raises(UsageError) as err:
        submit(**body)
    message = str(err.value)
    assert says in message and "\n" not in message


def test_a_body_that_is_no_object_is_refused() -> None:
    for body in ([], "x", None, 3):
        with pytest.raises(UsageError, match="JSON object"):
            spec_from_request(body, ME, 1)  # type: ignore[arg-type]


def test_gpu_ids_are_sorted_and_deduplicated() -> None:
    assert submit(gpu_ids=[3, 1, 3]).gpu_ids == (1, 3)
