"""The daemon's /metrics (opt-in ``metrics_listen``): GPU and process series as the
exporter has them, plus the queue: jobs by state and QoS, a running job's memory against
its limit, the wait and release-time histograms and the scheduling pass duration."""

from __future__ import annotations

import gzip
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon

GiB = 1 << 30


def scrape(url: str, gzipped: bool = False) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scrape's samples; ``gzipped``: as Prometheus asks (``Accept-Encoding: gzip``)."""
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzipped else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers.get("Content-Encoding") == ("gzip" if gzipped else None)
        body = r.read()
        text = (gzip.decompress(body) if gzipped else body).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def find(
    m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    for (n, ls), v in m.items():
        if n == name and all((k, val) in ls for k, val in labels.items()):
            return v
    return None


def test_daemon_metrics_cover_gpus_and_the_queue(metered: tuple[Daemon, str]) -> None:
    d, url = metered
    done = d.submit(
        "--mem", "1G", cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "1G", "--seconds", "0"]
    )
    assert d.cli("wait", str(done), timeout=60).returncode == 0
    d.wait_for_release(done)
    running = d.submit(
        "--qos",
        "guaranteed",
        "--mem",
        "4G",
        cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "3G", "--seconds", "30"],
    )
    d.wait_state(running, "running")
    held = d.submit("--mem", "1G", "--after", str(running), cmd=[PY, "-c", "pass"])

    def ready() -> bool:
        # Both: the queue's series come from the loop's last pass, the processes' from a
        # snapshot that serves scrapes for 100 ms, so one may see the job before the other.
        m = scrape(url)
        return (
            find(m, "gpuwarden_job_memory_bytes", job_id=str(running)) == 3.5 * GiB
            and find(m, "gpuwarden_process_memory_bytes", job_id=str(running)) == 3.5 * GiB
        )

    assert wait_for(ready, 20)
    m = scrape(url)
    assert find(m, "gpuwarden_jobs", state="succeeded", qos="burstable") == 1
    assert find(m, "gpuwarden_jobs", state="running", qos="guaranteed") == 1
    assert find(m, "gpuwarden_jobs", state="queued", qos="burstable") == 1
    # Memory and limit as the driver counts: the job's CUDA context (512 MiB on these
    # simulated GPUs) beside its allocations, the booked allowance beside its budget.
    assert (
        find(m, "gpuwarden_job_limit_bytes", job_id=str(running))
        == 4 * GiB + d.job(running)["context"]
    )
    assert (find(m, "gpuwarden_queue_oldest_wait_seconds") or 0) > 0
    assert find(m, "gpuwarden_queue_wait_seconds_count") == 2
    assert find(m, "gpuwarden_memory_release_seconds_count") == 1
    assert (find(m, "gpuwarden_placement_pass_seconds_count") or 0) > 5
    assert find(m, "gpuwarden_job_preemptions_total") == 0
    # The exporter's series are there too, with the job's id on its process.
    assert find(m, "gpuwarden_process_memory_bytes", job_id=str(running)) == 3.5 * GiB
    assert find(m, "gpuwarden_gpu_memory_total_bytes", gpu="0") == 24 * GiB
    zipped = scrape(url, gzipped=True)
    assert find(zipped, "gpuwarden_process_memory_bytes", job_id=str(running)) == 3.5 * GiB
    assert {k for k in zipped if not k[0].startswith("gpuwarden_placement_pass")} == {
        k for k in m if not k[0].startswith("gpuwarden_placement_pass")
    }
    assert d.cli("cancel", str(running)).returncode == 0
    assert d.wait_state(held, "cancelled")["reason"] == f"dependency {running} cancelled"


def test_bad_metrics_listen_is_a_clear_config_error(tmp_path: Path) -> None:
    from gpuwarden.daemon.config import read_config
    from gpuwarden.errors import UsageError

    p = tmp_path / "config.toml"
    p.write_text('metrics_listen = "everywhere"\n')
    with pytest.raises(UsageError, match="metrics_listen: invalid listen address"):
        read_config(p)
