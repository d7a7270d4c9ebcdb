"""What a job writes for the daemon to read (its allocator report) is the job user's
input: a report nested too deeply must not break the daemon's pass, which reads it as
root when the job ends."""

from __future__ import annotations

from tests.integration.daemon_fixture import PY, Daemon

_DEEP_REPORT = "import os; open(os.environ['GPUWARDEN_ALLOCATOR_REPORT'], 'w').write('[' * 4000)"


def test_a_deeply_nested_allocator_report_is_ignored(daemon: Daemon) -> None:
    bad = daemon.submit("--mem", "1G", cmd=[PY, "-c", _DEEP_REPORT])
    assert daemon.wait_state(bad, "succeeded", "failed")["state"] == "succeeded"
    after = daemon.submit("--mem", "1G", cmd=["true"])  # the scheduler still runs
    assert daemon.wait_state(after, "succeeded", "failed")["state"] == "succeeded"
    assert daemon.cli("daemon", "status").returncode == 0
    log = (daemon.home / "daemon.log").read_text(errors="replace")
    assert "RecursionError" not in log, log[-3000:]
