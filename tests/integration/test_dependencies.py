"""Dependencies beside ``--after`` (success): ``--after-any`` (any end) and
``--after-fail`` (an end without success), on a real daemon over the simulated machine.
A dependency that can never be met cancels the waiting job, saying which."""

from __future__ import annotations

from datetime import datetime

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon

SIM = [PY, "-m", "gpuwarden.sim.job", "--mem", "256M"]


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_after_fail_runs_only_after_a_failure(daemon: Daemon) -> None:
    failing = daemon.submit("--mem", "1G", cmd=[*SIM, "--seconds", "3", "--exit-code", "3"])
    passing = daemon.submit("--mem", "1G", cmd=[*SIM, "--seconds", "3"])
    on_fail = daemon.submit(
        "--mem", "1G", "--after-fail", str(failing), cmd=[*SIM, "--seconds", "0"]
    )
    never = daemon.submit("--mem", "1G", "--after-fail", str(passing), cmd=[*SIM, "--seconds", "0"])
    on_any = daemon.submit(
        "--mem", "1G", "--after-any", f"{failing},{passing}", cmd=[*SIM, "--seconds", "0"]
    )
    ok_on_failed = daemon.submit(
        "--mem", "1G", "--after", str(failing), cmd=[*SIM, "--seconds", "0"]
    )
    j = daemon.job(on_fail)  # what it waits for is kept and shown, whatever its state
    assert j["after_fail"] == [failing] and j["after"] == [] and j["after_any"] == []
    assert daemon.job(on_any)["after_any"] == [failing, passing]

    for jid in (on_fail, never, on_any, ok_on_failed):
        daemon.cli("wait", str(jid), timeout=60)
    dep_fail, dep_ok = daemon.job(failing), daemon.job(passing)
    assert dep_fail["state"] == "failed" and dep_ok["state"] == "succeeded"

    j = daemon.job(on_fail)
    assert j["state"] == "succeeded", j
    assert _t(j["started_at"]) >= _t(dep_fail["ended_at"])  # only after the failure
    assert [e["kind"] for e in j["events"]].count("placed") == 1, j["events"]

    j = daemon.job(never)
    assert j["state"] == "cancelled" and j["started_at"] is None, j
    assert j["reason"] == f"dependency {passing} succeeded: --after-fail can never be met"
    assert _t(j["ended_at"]) >= _t(dep_ok["ended_at"])

    j = daemon.job(on_any)
    assert j["state"] == "succeeded", j
    assert _t(j["started_at"]) >= max(_t(dep_fail["ended_at"]), _t(dep_ok["ended_at"]))

    j = daemon.job(ok_on_failed)
    assert j["state"] == "cancelled" and j["reason"] == f"dependency {failing} failed", j

    # A dependency on a job that does not exist is refused at submit, in one line.
    for flag in ("--after-any", "--after-fail"):
        bad = daemon.cli("submit", flag, "999999", "--", "true")
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
        assert "999999" in bad.stderr
    bad = daemon.cli("submit", "--after-fail", "x", "--", "true")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr


def test_a_waiting_dependant_says_what_it_waits_for(daemon: Daemon) -> None:
    first = daemon.submit("--mem", "1G", cmd=[*SIM, "--seconds", "30"])
    daemon.wait_state(first, "running")
    then = daemon.submit("--mem", "1G", "--after-fail", str(first), cmd=[*SIM, "--seconds", "0"])
    wait_for(
        lambda: daemon.job(then),
        20,
        0.1,
        until=lambda j: j["reason"] == f"waiting for job {first} (running)",
        what=str,
    )
    daemon.cli("cancel", "--kill", str(first), check=True)
    daemon.cli("wait", str(then), timeout=60)
    assert daemon.job(then)["state"] == "succeeded"  # cancelled is an end without success
