"""``logs`` of a job that ran more than once: each attempt keeps its own output
(jobs/<id>/attempt-<n>/), and ``--attempt N`` or ``--all`` reads past ones, on a real
daemon over the simulated 2 x 24 GiB machine."""

from __future__ import annotations

from pathlib import Path

from tests.integration.daemon_fixture import PY, Daemon

# Fails the first time it runs in a directory, succeeds the second: two attempts, each
# with output of its own.
TWICE = (
    "if [ -e ran ]; then echo second; echo err2 >&2; "
    "else touch ran; echo first; echo err1 >&2; exit 1; fi"
)


def _retried_job(daemon: Daemon, cwd: Path) -> int:
    jid = daemon.submit("--mem", "1G", "--cwd", str(cwd), cmd=["sh", "-c", TWICE])
    daemon.wait_state(jid, "failed")
    daemon.cli("retry", str(jid), check=True)
    daemon.wait_state(jid, "succeeded")
    return jid


def test_logs_reads_each_attempt_of_a_retried_job(daemon: Daemon, tmp_path: Path) -> None:
    jid = _retried_job(daemon, tmp_path)
    assert daemon.cli("logs", str(jid), check=True).stdout == "second\n"  # the latest
    assert daemon.cli("logs", str(jid), "--attempt", "1", check=True).stdout == "first\n"
    assert daemon.cli("logs", str(jid), "--attempt", "2", check=True).stdout == "second\n"
    assert daemon.cli("logs", str(jid), "--attempt", "1", "--stderr", check=True).stdout == "err1\n"
    assert daemon.cli("logs", str(jid), "--all", check=True).stdout == (
        f"==> job {jid} attempt 1 of 2 <==\nfirst\n==> job {jid} attempt 2 of 2 <==\nsecond\n"
    )
    # -f on an ended attempt prints it and stops.
    assert (
        daemon.cli("logs", str(jid), "-f", "--attempt", "1", timeout=10, check=True).stdout
        == "first\n"
    )


def test_logs_attempt_out_of_range_is_one_line(daemon: Daemon, tmp_path: Path) -> None:
    jid = _retried_job(daemon, tmp_path)
    for bad in ("3", "0"):
        r = daemon.cli("logs", str(jid), "--attempt", bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) <= 3, r.stderr
    r = daemon.cli("logs", str(jid), "--attempt", "3")
    assert "has had 2 attempts" in r.stderr, r.stderr
    r = daemon.cli("logs", str(jid), "--attempt", "1", "--all")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_logs_without_follow_reads_past_one_chunk(daemon: Daemon, tmp_path: Path) -> None:
    """The daemon answers in chunks of 1 MiB; ``logs`` prints the whole output."""
    jid = daemon.submit("--mem", "1G", cmd=["sh", "-c", "yes x | head -c 3000000"])
    daemon.wait_state(jid, "succeeded")
    assert len(daemon.cli("logs", str(jid), check=True).stdout) == 3_000_000


def test_logs_follow_moves_on_to_the_retry_under_a_header(daemon: Daemon) -> None:
    """-f on a job that the daemon retries after a CUDA OOM: the first run's output, then
    the retry's under its header, never the two mixed at one offset."""
    # The OOM comes 2 s in: -f is reading the first run by then.
    jid = daemon.submit(
        "--mem",
        "2G",
        cmd=[
            PY,
            "-m",
            "gpuwarden.sim.job",
            "--mem",
            "1G",
            "--grow-to",
            "3G",
            "--grow-seconds",
            "2",
            "--seconds",
            "3",
        ],
    )
    r = daemon.cli("logs", str(jid), "-f", "--stderr", timeout=60, check=True)
    job = daemon.job(jid)
    assert job["state"] == "succeeded" and job["attempts"] == 1, job
    first, header, rest = r.stdout.partition(f"==> job {jid} attempt 2 of 2 <==\n")
    assert header and "CUDA out of memory" in first, r.stdout
    assert "CUDA out of memory" not in rest, r.stdout
