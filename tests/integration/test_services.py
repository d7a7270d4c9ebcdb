"""Services (``submit --restart``) on a real daemon over the simulated 2 x 24 GiB machine:
restarts after the ends their policy names, with a backoff, given up at the limit; a
failing health check restarts; cancel stops a service for good; bad values are refused."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon
from tests.integration.test_daemon_metrics import find, scrape

SIM = [PY, "-m", "gpuwarden.sim.job", "--mem", "1G"]


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _kinds(job: dict[str, object]) -> list[str]:
    return [e["kind"] for e in job["events"]]  # type: ignore[attr-defined, index]


def test_a_crashing_service_is_restarted_to_its_limit_then_given_up(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem",
        "1G",
        "--qos",
        "guaranteed",
        "--restart",
        "on-failure",
        "--restart-limit",
        "2/10m",
        cmd=[*SIM, "--seconds", "0.2", "--exit-code", "3"],
    )
    job = daemon.wait_state(jid, "failed", timeout=60)
    kinds = _kinds(job)
    assert kinds.count("restarted") == 2 and kinds.count("restart_limit") == 1, kinds
    assert job["restarts"] == 2 and job["attempts"] == 2 and job["exit_code"] == 3
    assert job["reason"].startswith("restart limit: 2 restart(s) within 10m"), job["reason"]
    starts = [_t(e["at"]) for e in job["events"] if e["kind"] == "restarted"]
    placed = [_t(e["at"]) for e in job["events"] if e["kind"] == "placed"]
    assert len(placed) == 3
    # The backoff: 1 s after the first restart, 2 s after the second.
    assert placed[1] - starts[0] >= 0.9 and placed[2] - starts[1] >= 1.9, job["events"]
    assert job["service"]["restart"] == "on-failure" and job["service"]["restart_limit"] == 2
    text = daemon.cli("show", str(jid), check=True).stdout
    assert "restart on-failure, 2 restart(s) so far (limit 2 in 10m" in text, text
    ps = daemon.cli("ps", "--all", check=True).stdout
    assert "failed svc:2" in ps, ps
    csv = daemon.cli(
        "ps", "--all", "--format", "csv", "-o", "id,restart,restarts", check=True
    ).stdout
    assert f"{jid},on-failure,2" in csv.splitlines(), csv


def test_restart_always_restarts_after_exit_0(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem",
        "1G",
        "--restart",
        "always",
        "--restart-limit",
        "1/10m",
        cmd=[*SIM, "--seconds", "0.2"],
    )
    job = daemon.wait_state(jid, "succeeded", timeout=60)
    kinds = _kinds(job)
    assert kinds.count("restarted") == 1 and kinds.count("restart_limit") == 1, kinds
    assert "exit code 0" in next(e["detail"] for e in job["events"] if e["kind"] == "restarted")


def test_on_failure_does_not_restart_after_exit_0(daemon: Daemon) -> None:
    jid = daemon.submit("--mem", "1G", "--restart", "on-failure", cmd=[*SIM, "--seconds", "0.2"])
    job = daemon.wait_state(jid, "succeeded", timeout=60)
    assert job["restarts"] == 0 and "restarted" not in _kinds(job)


def test_a_failing_health_check_restarts_the_service(daemon: Daemon, tmp_path: Path) -> None:
    # Healthy while the flag file is there; the test takes it away.
    flag = tmp_path / "healthy"
    flag.touch()
    jid = daemon.submit(
        "--mem",
        "1G",
        "--restart",
        "on-failure",
        "--health-cmd",
        f"test -e {flag}",
        "--health-interval",
        "200ms",
        "--health-grace",
        "0.5s",
        cmd=[*SIM, "--seconds", "600"],
    )
    job = daemon.wait_state(jid, "running", timeout=30)
    time.sleep(1.5)  # past the grace, several healthy checks
    job = daemon.job(jid)
    assert job["state"] == "running" and job["health_failures"] == 0, job
    flag.unlink()
    job = wait_for(
        lambda: daemon.job(jid),
        30,
        0.2,
        until=lambda j: "restarted" in _kinds(j),
        what=lambda j: f"job {jid} was not restarted: {j}",
    )
    assert job["health_failures"] == 1 and job["restarts"] == 1, job
    failed = next(e for e in job["events"] if e["kind"] == "health_failed")
    assert failed["detail"] == "health command exited 1", failed
    flag.touch()  # healthy again: the restarted attempt runs on
    job = daemon.wait_state(jid, "running", timeout=30)
    assert job["attempts"] == 1
    text = daemon.cli("show", str(jid), check=True).stdout
    assert "health: command " in text and "1 failure(s), last " in text, text
    daemon.cli("cancel", str(jid), check=True)
    job = daemon.wait_state(jid, "cancelled", timeout=30)


def test_cancel_stops_a_service_for_good(daemon: Daemon) -> None:
    jid = daemon.submit("--mem", "1G", "--restart", "always", cmd=[*SIM, "--seconds", "600"])
    daemon.wait_state(jid, "running", timeout=30)
    daemon.cli("cancel", str(jid), check=True)
    job = daemon.wait_state(jid, "cancelled", timeout=30)
    time.sleep(1.0)  # passes after the end: nothing starts it again
    job = daemon.job(jid)
    assert job["state"] == "cancelled" and job["restarts"] == 0, job
    assert "restarted" not in _kinds(job) and _kinds(job).count("placed") == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--restart", "sometimes"), "restart must be on-failure, always or no"),
        (("--restart", "always", "--restart-limit", "0/10m"), "N must be a whole number"),
        (("--restart", "always", "--restart-limit", "3"), "restart_limit must be N/DURATION"),
        (
            ("--restart", "always", "--health-cmd", "true", "--health-interval", "-1"),
            "--health-interval",
        ),
        (("--restart", "always", "--health-cmd", "true", "--health-url", "http://x/"), "not both"),
        (
            (
                "--health-cmd",
                "true",
            ),
            "need(s) restart",
        ),
    ],
)
def test_bad_service_values_are_one_line_and_exit_2(
    daemon: Daemon, args: tuple[str, ...], said: str
) -> None:
    r = daemon.cli("submit", *args, "--", *SIM)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_a_daemon_restart_re_adopts_a_service_and_restarts_it(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem", "1G", "--restart", "on-failure", cmd=[*SIM, "--seconds", "3", "--exit-code", "1"]
    )
    daemon.wait_state(jid, "running", timeout=30)
    daemon.stop()
    daemon.start()
    job = daemon.job(jid)
    assert job["state"] in ("running", "queued"), job  # adopted, or its end collected
    wait_for(
        lambda: daemon.job(jid),
        30,
        0.2,
        until=lambda j: "restarted" in _kinds(j),
        what=lambda j: f"job {jid} was not restarted: {j}",
    )
    job = daemon.wait_state(jid, "running", timeout=30)
    assert job["restarts"] == 1 and job["attempts"] == 1
    daemon.cli("cancel", str(jid), check=True)
    daemon.wait_state(jid, "cancelled", timeout=30)


def _running_after_oom_retry(daemon: Daemon, jid: int) -> dict[str, object]:
    """The service once it runs again after its first OOM retry."""
    return dict(
        wait_for(
            lambda: daemon.job(jid),
            30,
            0.2,
            until=lambda j: j["state"] == "running" and j["oom_retries"] == 1,
            what=lambda j: f"job {jid} was not running again after an OOM retry: {j}",
        )
    )


def test_an_oom_of_a_service_restarts_it_with_the_bigger_budget(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem",
        "4G",
        "--restart",
        "on-failure",
        cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "4G", "--grow-to", "10G", "--seconds", "600"],
    )
    job = _running_after_oom_retry(daemon, jid)
    assert job["budget"] >= 10 * (1 << 30) and "retried" in _kinds(job), job
    assert job["restarts"] == 0  # the OOM rule's retry, not a same-budget restart
    daemon.cli("cancel", str(jid), check=True)
    daemon.wait_state(jid, "cancelled", timeout=30)


def test_metrics_count_restarts_and_health_failures(metered: tuple[Daemon, str]) -> None:
    daemon, url = metered
    # Never healthy: stopped after its grace, restarted once, stopped again, given up.
    jid = daemon.submit(
        "--mem",
        "1G",
        "--restart",
        "on-failure",
        "--restart-limit",
        "1/1h",
        "--health-cmd",
        "exit 1",
        "--health-interval",
        "0.2s",
        "--health-grace",
        "0.3s",
        cmd=[*SIM, "--seconds", "600"],
    )
    job = daemon.wait_state(jid, "failed", timeout=60)
    assert job["restarts"] == 1 and job["health_failures"] == 2, job
    assert job["reason"].startswith("restart limit: 1 restart(s) within 1h"), job["reason"]
    m = scrape(url)
    who = {"job_id": str(jid), "user": job["user"]}
    assert find(m, "gpuwarden_service_restarts_total", **who) == 1
    assert find(m, "gpuwarden_service_health_failures_total", **who) == 2


def test_a_restarted_service_takes_its_gpu_again(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem",
        "1G",
        "--restart",
        "on-failure",
        "--restart-limit",
        "2/10m",
        cmd=[*SIM, "--seconds", "1.5", "--exit-code", "1"],
    )
    assert daemon.wait_state(jid, "running", timeout=30)["gpus"] == [0]
    # GPU 1 now fits a 1G job best (the least room left over): a fresh placement goes there.
    other = daemon.submit(
        "--mem",
        "10G",
        "--gpu-ids",
        "1",
        cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "10G", "--seconds", "60"],
    )
    daemon.wait_state(other, "running", timeout=30)
    job = daemon.wait_state(jid, "failed", timeout=60)
    placed = [e["detail"] for e in job["events"] if e["kind"] == "placed"]
    assert len(placed) == 3 and all(d.startswith("GPU 0, ") for d in placed), placed
    daemon.cli("cancel", str(other), check=True)


def _placed_at(job: dict[str, object]) -> list[float]:
    return [
        _t(e["at"])
        for e in job["events"]  # type: ignore[attr-defined, index]
        if e["kind"] == "placed"
    ]


def test_a_restarting_service_keeps_its_room_from_higher_priority_work(daemon: Daemon) -> None:
    # A 10G service on GPU 0 that crashes; an 18G job of priority 100 that fits on GPU 0
    # only in the service's room. Through every backoff and restart the service keeps it:
    # the big job starts only once the service is given up.
    svc = daemon.submit(
        "--mem",
        "10G",
        "--gpu-ids",
        "0",
        "--qos",
        "guaranteed",
        "--restart",
        "on-failure",
        "--restart-limit",
        "2/10m",
        cmd=[*SIM, "--seconds", "1.5", "--exit-code", "1"],
    )
    daemon.wait_state(svc, "running", timeout=30)
    big = daemon.submit(
        "--mem",
        "18G",
        "--gpu-ids",
        "0",
        "--priority",
        "100",
        cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "18G", "--seconds", "0.2"],
    )
    job = daemon.wait_state(svc, "failed", timeout=60)
    assert job["restarts"] == 2 and len(_placed_at(job)) == 3, _kinds(job)
    done = daemon.wait_state(big, "succeeded", timeout=60)
    assert _placed_at(done)[0] >= _t(job["ended_at"]), (job["events"], done["events"])


def test_a_service_retried_after_an_oom_goes_before_higher_priority_work(daemon: Daemon) -> None:
    # The service grows from 4G to 10G and dies of an OOM; a 20G job of priority 100
    # waits beside it on GPU 0 (it may not preempt a guaranteed job). The retried
    # service (10G and more) is placed first.
    svc = daemon.submit(
        "--mem",
        "4G",
        "--gpu-ids",
        "0",
        "--qos",
        "guaranteed",
        "--restart",
        "on-failure",
        cmd=[
            PY,
            "-m",
            "gpuwarden.sim.job",
            "--mem",
            "4G",
            "--grow-to",
            "10G",
            "--grow-seconds",
            "2",
            "--seconds",
            "600",
        ],
    )
    daemon.wait_state(svc, "running", timeout=30)
    big = daemon.submit(
        "--mem",
        "20G",
        "--gpu-ids",
        "0",
        "--priority",
        "100",
        cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "20G", "--seconds", "0.2"],
    )
    _running_after_oom_retry(daemon, svc)
    assert daemon.job(big)["state"] == "queued", daemon.job(big)
    daemon.cli("cancel", str(svc), check=True)
    daemon.wait_state(big, "succeeded", timeout=60)


def test_a_cancel_during_a_health_stop_is_no_restart() -> None:
    from gpuwarden.daemon.restart import cancel_asked
    from gpuwarden.jobs.model import Event

    ev = [Event(1.0, "placed"), Event(2.0, "health_failed"), Event(2.1, "cancel_requested")]
    assert cancel_asked(ev)
    assert not cancel_asked([*ev, Event(3.0, "restarted"), Event(4.0, "placed")])
    assert not cancel_asked(ev[:2])
