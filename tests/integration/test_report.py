"""``gpuwarden report`` on a real daemon over the simulated 2 x 24 GiB machine: its
figures add up against the jobs that ran, as ``show`` tells them."""

from __future__ import annotations

import csv
import io
import time
from datetime import datetime
from typing import Any

from gpuwarden.units import GiB
from tests.integration.daemon_fixture import PY, Daemon

SIM = [PY, "-m", "gpuwarden.sim.job"]


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _hours(j: dict[str, Any]) -> float:
    return (_t(j["ended_at"]) - _t(j["started_at"])) / 3600


def _nearest_rank(values: list[float], p: float) -> float:
    import math

    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)), 1) - 1]


def test_report_figures_add_up_against_the_jobs_run(daemon: Daemon) -> None:
    ids = [
        daemon.submit(
            "--mem", "4G", "--group", "train", cmd=[*SIM, "--mem", "1G", "--seconds", "1"]
        ),
        daemon.submit(
            "--mem",
            "2G",
            "--gpus",
            "2",
            "--group",
            "train",
            cmd=[*SIM, "--mem", "1G", "--seconds", "0.5"],
        ),
        daemon.submit(
            "--mem", "2G", cmd=[*SIM, "--mem", "1G", "--seconds", "0.3", "--exit-code", "3"]
        ),
        daemon.submit(
            "--mem",
            "2G",
            "--retries",
            "0",
            cmd=[*SIM, "--mem", "1G", "--grow-to", "3G", "--seconds", "0"],
        ),
    ]
    for jid in ids:
        daemon.cli("wait", str(jid), timeout=60)
    jobs = [daemon.job(jid) for jid in ids]
    assert [j["state"] for j in jobs] == ["succeeded", "succeeded", "failed", "failed"]

    out = daemon.json("report", "--since", "1h")
    assert out["by"] == "user" and len(out["rows"]) == 1, out
    row = out["rows"][0]
    assert row["jobs"] == 4 and row["succeeded"] == 2 and row["failed"] == 2
    gpu_hours = sum(_hours(j) * len(j["gpus"]) for j in jobs)
    reserved = sum(j["budget"] / GiB * len(j["gpus"]) * _hours(j) for j in jobs)
    used = sum((j["peak_memory"] or 0) / GiB * len(j["gpus"]) * _hours(j) for j in jobs)
    assert gpu_hours > 2.0 / 3600 and 0 < used < reserved  # real figures, not zeros
    assert abs(row["gpu_hours"] - gpu_hours) < 2e-6, (row, gpu_hours)
    assert abs(row["reserved_gib_hours"] - reserved) < 2e-6, (row, reserved)
    assert abs(row["used_gib_hours"] - used) < 2e-6, (row, used)
    assert row["ooms"] == 1 and row["preemptions"] == 0
    waits = [
        next(_t(e["at"]) for e in j["events"] if e["kind"] == "placed") - _t(j["submitted_at"])
        for j in jobs
    ]
    assert abs(row["wait_p50"] - _nearest_rank(waits, 50)) < 1e-3
    assert abs(row["wait_p95"] - max(waits)) < 1e-3

    groups = {r["group"]: r for r in daemon.json("report", "--by", "group")["rows"]}
    assert set(groups) == {"train", "-"}
    assert groups["train"]["jobs"] == 2 and groups["-"]["jobs"] == 2
    assert abs(groups["train"]["gpu_hours"] + groups["-"]["gpu_hours"] - row["gpu_hours"]) < 2e-6

    r = daemon.cli("report", "--format", "csv", check=True)
    table = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(table) == 1 and table[0]["jobs"] == "4" and table[0]["ooms"] == "1"
    text = daemon.cli("report", check=True).stdout
    assert "GPU-H" in text and "RESERVED GiB-h" in text, text

    time.sleep(1.2)  # nothing ended within the last second
    assert daemon.json("report", "--since", "1s")["rows"] == []
    bad = daemon.cli("report", "--by", "host")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
    bad = daemon.cli("report", "--since", "yesterday")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
