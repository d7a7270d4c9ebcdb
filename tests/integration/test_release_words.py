"""What the daemon says of memory a dead process keeps after its job ended, on a real
daemon over the simulated 2 x 24 GiB machine: nothing is "reaped" when nothing was, and an
admin's unreserve says the hold was released, not that the memory came back."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, start_daemon


def test_a_dead_pids_memory_is_advice_and_unreserve_says_what_happened(tmp_path: Path) -> None:
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", 'release_timeout = "500ms"\n'):
        # A context the driver fails to free: the simulated job's memory outlives it.
        jid = d.submit(
            "--gpu-ids",
            "0",
            "--mem",
            "4G",
            cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "3G", "--seconds", "0", "--leak"],
        )
        d.wait_state(jid, "succeeded")
        job = wait_for(
            lambda d=d, jid=jid: d.job(jid),
            20,
            0.2,
            until=lambda j: any(e["kind"] in ("reap_advice", "reaped") for e in j["events"]),
            what=lambda j: f"job {j['id']} got no reap advice: {j}",
        )
        kinds = [e["kind"] for e in job["events"]]
        assert "reaped" not in kinds, job["events"]  # the pid was dead: nothing to reap
        leak = next(e for e in job["events"] if e["kind"] == "leak")["detail"]
        assert "dead pid" in leak and "still holds 3584MiB on GPU 0" in leak, leak
        assert d.cli("unreserve", str(jid)).returncode == 0
        rel = d.job(jid)["memory_release"]
        assert rel["how"] == "cleared by " + d.job(jid)["user"]
        text = d.cli("show", str(jid), check=True).stdout
        line = next(x for x in text.splitlines() if x.startswith("  release"))
        assert "memory back" not in line, line
        assert f"hold released by {d.job(jid)['user']}" in line, line
        assert "dead pid" in line and "still holds 3584MiB on GPU 0" in line, line
