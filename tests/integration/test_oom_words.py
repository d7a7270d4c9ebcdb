"""What ``wait`` and ``show`` say of a job that failed of a CUDA OOM, on a real daemon over
the simulated 2 x 24 GiB machine: that it ran out of memory at its limit and what it
asked for, never declared-vs-peak advice (that is for jobs that ended normally)."""

from __future__ import annotations

from tests.integration.daemon_fixture import PY, Daemon


def test_an_oom_failure_says_it_ran_out_at_its_limit(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem",
        "2G",
        "--retries",
        "0",
        cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "1G", "--grow-to", "3G", "--seconds", "0"],
    )
    r = daemon.cli("wait", str(jid), timeout=60)
    assert r.returncode != 0
    job = daemon.job(jid)
    assert job["state"] == "failed" and job["declared_vs_peak"] is None, job
    said = (
        "ran out of GPU memory at its limit 2048MiB: it tried to allocate 2048MiB "
        "holding 1024MiB (needs 3072MiB)"
    )
    assert job["oom_end"] == said, job
    assert f"job {jid} failed: {said}" in r.stderr, r.stderr
    assert "declared:" not in r.stderr, r.stderr
    shown = daemon.cli("show", str(jid), check=True).stdout
    assert said in shown and "declared:" not in shown, shown


def test_a_succeeded_job_still_gets_declared_vs_peak(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem", "4G", cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "2G", "--seconds", "1"]
    )
    r = daemon.cli("wait", str(jid), timeout=60)
    assert r.returncode == 0, r.stderr
    job = daemon.job(jid)
    assert job["oom_end"] is None and "over-declared by" in job["declared_vs_peak"], job
    assert "over-declared by" in r.stderr, r.stderr
