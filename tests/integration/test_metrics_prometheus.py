"""The exporter scraped by a real Prometheus server: the leaked bytes of the scenario's
GPU 3 and a running job's memory arrive in Prometheus as the scenario says; a process
that went away leaves the next scrape."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import EXAMPLES, free_port, make_env

GiB = 1 << 30
LEAKED_GPU3 = 126 << 20  # examples/a100x8-shared.json: GPU 3 holds 126 MiB, no process


def get(url: str, timeout: float = 5) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except urllib.error.HTTPError as e:  # Prometheus answers 503 until it is ready
        e.close()  # the answer it carries, and the socket under it
        raise


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    env = make_env(tmp_path, EXAMPLES / "a100x8-shared.json")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "exporter",
            "--listen",
            f"127.0.0.1:{port}",
            "--cache",
            "0.2",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        assert wait_for(lambda: _up(url), 20), "the exporter did not come up"
        yield url, env
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def _up(url: str) -> bool:
    try:
        get(url)
        return True
    except OSError:
        return False


@pytest.fixture
def prometheus(tmp_path: Path, exporter: tuple[str, dict[str, str]]) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (Debian package prometheus; .ci/run installs it)")
    target = urllib.parse.urlparse(exporter[0]).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: gpuwarden\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(20)


def query(base: str, promql: str) -> list[dict[str, Any]]:
    body = json.loads(get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def value(base: str, promql: str) -> float | None:
    try:
        result = query(base, promql)
    except OSError:
        return None  # not up yet
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_leaks_and_a_jobs_memory(
    exporter: tuple[str, dict[str, str]], prometheus: str
) -> None:
    url, env = exporter
    job_env = {**env, "GPUWARDEN_JOB": "42", "CUDA_VISIBLE_DEVICES": "5"}
    job = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.sim.job", "--mem", "3G", "--seconds", "60"], env=job_env
    )
    try:
        assert wait_for(
            lambda: value(prometheus, 'gpuwarden_gpu_leaked_bytes{gpu="3"}') is not None, 60
        ), "Prometheus never scraped the exporter"
        assert (
            value(prometheus, 'gpuwarden_gpu_leaked_bytes{gpu="3",kind="unaccounted"}')
            == LEAKED_GPU3
        )
        promql = 'gpuwarden_process_memory_bytes{job_id="42"}'
        # the job's 3 GiB and the CUDA context the simulated driver charges beside them
        assert wait_for(lambda: value(prometheus, promql) == 3.5 * GiB, 30)
        [series] = query(prometheus, promql)
        assert series["metric"]["gpu"] == "5" and series["metric"]["pid"] == str(job.pid)
        assert series["metric"]["user"]
    finally:
        job.terminate()
        job.wait(10)
    # Gone from the exporter's next scrape (Prometheus marks it stale).
    assert wait_for(lambda: 'job_id="42"' not in get(url), 10)
    assert wait_for(
        lambda: value(prometheus, 'gpuwarden_process_memory_bytes{job_id="42"}') is None, 30
    )


def test_exporter_bad_listen_address_is_one_line(tmp_path: Path) -> None:
    env = make_env(tmp_path, EXAMPLES / "a100x8-shared.json")
    r = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "exporter", "--listen", "nowhere"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 2 and "invalid listen address 'nowhere'" in r.stderr
    assert "Traceback" not in r.stderr
