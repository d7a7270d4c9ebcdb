"""Job ids never repeat, even when the state database is reset.

Root's job 1 writes its output to ``jobs/1``. The daemon stops, state.db is removed, the
daemon starts with a fresh database. B's first job must not be job 1 again: it would
find root's old directory (its launch failing) and ``gpuwarden logs 1`` would hand B
root's output. New ids start above the highest job directory, and daemon.log warns."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import start_daemon
from tests.security import pidns
from tests.security.pidns import User

SECRET = "gw-root-output-7d2a"


def test_reset_database_never_reuses_a_job_id(users: tuple[User, User], tmp_path: Path) -> None:
    _, b = users
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json"):
        old = d.submit("--cwd", "/", cmd=["sh", "-c", f"echo {SECRET}"])
        assert d.cli("wait", str(old)).returncode == 0
        assert SECRET in d.cli("logs", str(old)).stdout
        d.stop()
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            (d.home / name).unlink(missing_ok=True)
        d.start()

        env = pidns.env_of(d.env, b)
        r = d.cli(
            "submit", "--cwd", b.home, "--", "sh", "-c", "echo mine", env=env, prefix=b.prefix
        )
        assert r.returncode == 0, r.stderr
        new = int(r.stdout)
        assert new > old
        assert d.cli("wait", str(new), env=env, prefix=b.prefix).returncode == 0
        logs = d.cli("logs", str(new), env=env, prefix=b.prefix)
        assert "mine" in logs.stdout and SECRET not in logs.stdout + logs.stderr
        stale = d.cli("logs", str(old), env=env, prefix=b.prefix)
        assert SECRET not in stale.stdout + stale.stderr
        assert (d.home / "jobs" / str(old)).is_dir()  # left as it was
        log = (d.home / "daemon.log").read_text()
        assert "was the database reset?" in log and f"start at {old + 1}" in log


def test_launch_never_reuses_an_existing_job_directory(tmp_path: Path) -> None:
    """A directory already at the place of a new attempt (planted, or left by an earlier
    job) is refused: the job fails with one line and the directory is left untouched."""
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json"):
        first = d.submit("--cwd", "/", cmd=["true"])
        assert d.cli("wait", str(first)).returncode == 0
        (attempt,) = (d.home / "jobs" / str(first)).iterdir()
        planted = d.home / "jobs" / str(first + 1) / attempt.name
        planted.mkdir(parents=True)
        (planted / "stdout").write_text(SECRET)
        job = d.submit("--cwd", "/", cmd=["true"])
        assert job == first + 1
        j = d.wait_state(job, "failed")
        assert "already exists" in j["reason"] and "Traceback" not in j["reason"]
        assert (planted / "stdout").read_text() == SECRET
        assert not (planted / "spec.json").exists()
