"""Any user could submit ``--priority 1000`` or ``--qos guaranteed`` and preempt other
users' jobs. [limits] max_priority and qos say what a user may ask for (defaults:
priority <= 0, burstable and besteffort); a request past it is refused at submit with
one line. Root and admins are not held to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.daemon.config import read_config
from gpuwarden.errors import UsageError
from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import start_daemon
from tests.security import pidns
from tests.security.pidns import User

SLEEP = ["sleep", "600"]


def test_users_may_not_take_priority_or_guaranteed_by_default(
    users: tuple[User, User], tmp_path: Path
) -> None:
    a, b = users
    config = f'[limits.users.{b.name}]\nmax_priority = 10\nqos = ["guaranteed", "burstable"]\n'
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", config=config):
        env_a, env_b = pidns.env_of(d.env, a), pidns.env_of(d.env, b)
        for asked, word in (
            (["--priority", "1000"], "max_priority"),
            (["--priority", "1"], "max_priority"),
            (["--qos", "guaranteed", "--mem", "1G"], "qos"),
        ):
            r = d.cli("submit", "--cwd", a.home, *asked, "--", *SLEEP, env=env_a, prefix=a.prefix)
            assert r.returncode != 0 and r.stdout == "", r
            assert r.stderr.count("\n") == 1 and word in r.stderr, r.stderr
            assert "Traceback" not in r.stderr

        r = d.cli(
            "submit",
            "--cwd",
            a.home,
            "--priority",
            "0",
            "--qos",
            "besteffort",
            "--",
            *SLEEP,
            env=env_a,
            prefix=a.prefix,
        )
        assert r.returncode == 0, r.stderr
        # b's own table: priority up to 10 and guaranteed, but not besteffort.
        r = d.cli(
            "submit",
            "--cwd",
            b.home,
            "--priority",
            "10",
            "--qos",
            "guaranteed",
            "--mem",
            "1G",
            "--",
            *SLEEP,
            env=env_b,
            prefix=b.prefix,
        )
        assert r.returncode == 0, r.stderr
        r = d.cli(
            "submit",
            "--cwd",
            b.home,
            "--qos",
            "besteffort",
            "--",
            *SLEEP,
            env=env_b,
            prefix=b.prefix,
        )
        assert r.returncode != 0 and "qos" in r.stderr and "Traceback" not in r.stderr
        # Root is unlimited.
        assert (
            d.submit(
                "--cwd", "/", "--priority", "1000", "--qos", "guaranteed", "--mem", "1G", cmd=SLEEP
            )
            > 0
        )


def test_priority_policy_is_validated(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    lim = read_config(cfg).policy.limits.of("anyone")
    assert (lim.max_priority, lim.qos) == (0, ("burstable", "besteffort"))
    cfg.write_text('[limits]\nmax_priority = 5\nqos = ["guaranteed"]\n')
    lim = read_config(cfg).policy.limits.of("anyone")
    assert (lim.max_priority, lim.qos) == (5, ("guaranteed",))
    for bad in ('max_priority = "high"', "max_priority = 5000", 'qos = ["gold"]', 'qos = "x"'):
        cfg.write_text(f"[limits]\n{bad}\n")
        with pytest.raises(UsageError, match=r"max_priority|qos"):
            read_config(cfg)
