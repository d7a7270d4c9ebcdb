"""A job that traps SIGTERM with ``--grace 1000000d`` would never end on cancel (root's
too) or preemption. A --grace past the daemon's ``max_grace`` is refused at submit with
one line, and ``cancel --kill`` SIGKILLs a job's tree at once, even one already in its
grace, for its owner or an admin only."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuwarden.daemon.config import read_config
from gpuwarden.errors import UsageError
from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import start_daemon
from tests.security import pidns
from tests.security.pidns import User

TRAPS_TERM = ["sh", "-c", "trap '' TERM; echo up; exec sleep 600"]  # sleep ignores it too


def test_grace_past_max_grace_is_refused_and_kill_ends_a_job_in_its_grace(
    users: tuple[User, User], tmp_path: Path
) -> None:
    a, b = users
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", config='max_grace = "5m"\n'):
        env_a, env_b = pidns.env_of(d.env, a), pidns.env_of(d.env, b)
        r = d.cli(
            "submit",
            "--cwd",
            a.home,
            "--grace",
            "1000d",
            "--",
            *TRAPS_TERM,
            env=env_a,
            prefix=a.prefix,
        )
        assert r.returncode != 0 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and "max_grace" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr

        r = d.cli(
            "submit",
            "--cwd",
            a.home,
            "--grace",
            "5m",
            "--",
            *TRAPS_TERM,
            env=env_a,
            prefix=a.prefix,
        )
        assert r.returncode == 0, r.stderr
        job = int(r.stdout)
        d.wait_state(job, "running")
        wait_for(
            lambda d=d, job=job: "up" in d.cli("logs", str(job)).stdout,
            timeout=20,
            interval=0.1,
            what="the job's SIGTERM handler to be set",
        )

        other = d.cli("cancel", "--kill", str(job), env=env_b, prefix=b.prefix)
        assert other.returncode != 0 and "Traceback" not in other.stderr
        assert d.cli("cancel", str(job), env=env_a, prefix=a.prefix).returncode == 0
        time.sleep(1.5)
        assert d.job(job)["state"] == "running"  # SIGTERM ignored: in its 5 min grace

        start = time.monotonic()
        r = d.cli("cancel", "--kill", str(job), env=env_a, prefix=a.prefix)
        assert r.returncode == 0 and "SIGKILL" in r.stdout, r.stderr
        j = d.wait_state(job, "cancelled", timeout=20)
        assert time.monotonic() - start < 15
        assert any("(SIGKILL)" in (e.get("detail") or "") for e in j["events"])


def test_max_grace_is_validated(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    assert read_config(cfg).max_grace == 300.0  # no file: the default, 5 min
    cfg.write_text('grace = "10m"\n')
    with pytest.raises(UsageError, match="grace must be at most max_grace"):
        read_config(cfg)
    cfg.write_text('max_grace = "forever"\n')
    with pytest.raises(UsageError, match="max_grace"):
        read_config(cfg)
    cfg.write_text('max_grace = "1h"\ngrace = "10m"\n')
    assert (read_config(cfg).grace, read_config(cfg).max_grace) == (600.0, 3600.0)


def test_a_stored_grace_past_a_lowered_max_grace_is_capped(tmp_path: Path) -> None:
    """A job accepted under a higher cap, launched after the admin lowered max_grace,
    gets max_grace: a cancel ends it within that even though it ignores SIGTERM."""
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", config='max_grace = "1h"\n'):
        first = d.submit("--cwd", "/", cmd=["sleep", "4"])  # keeps it queued meanwhile
        job = d.submit("--cwd", "/", "--grace", "30m", "--after", str(first), cmd=TRAPS_TERM)
        d.stop()
        cfg = d.home / "config.toml"
        cfg.write_text(cfg.read_text().replace('max_grace = "1h"', 'max_grace = "2s"'))
        d.start()
        assert d.job(job)["grace"] == 1800.0
        d.wait_state(job, "running")
        wait_for(
            lambda d=d, job=job: "up" in d.cli("logs", str(job)).stdout,
            timeout=20,
            interval=0.1,
            what="the job's SIGTERM handler to be set",
        )
        start = time.monotonic()
        assert d.cli("cancel", str(job)).returncode == 0
        d.wait_state(job, "cancelled", timeout=30)
        assert time.monotonic() - start < 15
