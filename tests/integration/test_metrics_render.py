"""The exporter's own text rendering writes exactly what prometheus_client's
``generate_latest`` writes, on the 8 GPUs × 200 processes scenario and on label values
that need escaping, scrape after scrape as series come and go; over HTTP the plain-text
scrape is those bytes (gzip too), and an OpenMetrics scrape what prometheus_client's
OpenMetrics encoder writes."""

from __future__ import annotations

import gzip
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from gpuwarden.gpus.sim import SimBackend
from gpuwarden.metrics.collector import SnapshotCollector, render_text
from gpuwarden.metrics.exporter import registry_for, start
from gpuwarden.observe.snapshot import Snapshot, take_snapshot
from tests.helpers.builders import GiB, gpu, proc, snapshot
from tests.integration.daemon_fixture import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimBackend]:
    d = tmp_path_factory.mktemp("render")
    scenario = d / "8x200.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gen_scenario.py"),
            "-o",
            str(scenario),
            "--gpus",
            "8",
            "--per-gpu",
            "200",
            "--seed",
            "1",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUWARDEN_SIM_STATE", str(d / "state"))
    yield SimBackend.from_file(scenario)
    mp.undo()


def reference(
    c: SnapshotCollector, encode: Callable[[CollectorRegistry], bytes] = generate_latest
) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(c)
    return encode(reg)


@pytest.mark.parametrize(("pid_labels", "holders"), [(True, True), (False, True), (True, False)])
def test_the_same_bytes_on_8_gpus_by_200_processes(
    backend: SimBackend, pid_labels: bool, holders: bool
) -> None:
    # A long cache: both renderings read one snapshot (snapshot_seconds included).
    c = SnapshotCollector(
        lambda: take_snapshot(backend, holders=holders),
        cache_seconds=600,
        pid_labels=pid_labels,
        holders=holders,
    )
    first = c.render_text()
    assert first == reference(c)
    assert c.render_text() == first  # the second from the kept parts
    om = c.render_text(openmetrics_latest, "om")
    assert om == reference(c, openmetrics_latest)
    assert om.endswith(b"# EOF\n")
    assert c.render_text(openmetrics_latest, "om") == om
    assert first.count(b"\ngpuwarden_process_memory_bytes{") >= (1500 if pid_labels else 8)


def test_escaped_labels_and_series_that_come_and_go() -> None:
    odd = proc(
        101, 0, 2 * GiB, sm=50, user='a"b\\c', container="ctr\nx", env={"GPUWARDEN_JOB": "ü 7"}
    )
    snaps: list[Snapshot] = [
        snapshot([(gpu(0, used=7 * GiB, utilization=40), [odd, proc(102, 0, GiB)])]),
        snapshot(
            [
                (
                    gpu(0, used=3 * GiB, utilization=41),
                    [proc(102, 0, 2 * GiB), proc(103, 0, GiB, sm=None)],
                )
            ]
        ),
        snapshot([(gpu(0, used=7 * GiB, utilization=40), [odd])]),
    ]
    now = [0.0]
    c = SnapshotCollector(lambda: snaps[int(now[0])], cache_seconds=0.5, clock=lambda: now[0])
    for i in range(3):
        now[0] = float(i)
        text = c.render_text()
        assert text == reference(c), i
        assert c.render_text(openmetrics_latest, "om") == reference(c, openmetrics_latest), i
        assert (b'pid="101"' in text) == (i != 1)
        assert (b'pid="103"' in text) == (i == 1)


def test_a_family_equal_to_the_last_keeps_its_text_and_minus_zero_is_zero() -> None:
    """A family's rows equal to the last render's reuse its text: 0.0 and -0.0 are equal,
    so both render as 0.0 (generate_latest of the collector too), and a family that
    changes beside unchanged ones is rendered anew."""
    snaps = [
        snapshot([(gpu(0, used=GiB, power_watts=-0.0), [proc(101, 0, GiB)])]),
        snapshot([(gpu(0, used=GiB, power_watts=0.0), [proc(101, 0, GiB)])]),
        snapshot([(gpu(0, used=GiB, power_watts=0.0), [proc(101, 0, 2 * GiB)])]),
    ]
    now = [0.0]
    c = SnapshotCollector(lambda: snaps[int(now[0])], cache_seconds=0.5, clock=lambda: now[0])
    texts = []
    for i in range(3):
        now[0] = float(i)
        texts.append(c.render_text())
        assert texts[-1] == reference(c), i
        assert b'gpuwarden_gpu_power_watts{gpu="0"} 0.0\n' in texts[-1]
        assert c.render_text() is texts[-1]  # the cached snapshot's bytes, not rendered again
    before, after = texts[1].split(b"\n"), texts[2].split(b"\n")
    changed = {a.rpartition(b" ")[0] for a, b in zip(before, after, strict=True) if a != b}
    # (how long the snapshot took changes too, unless two took the same to the digit)
    assert changed - {b"gpuwarden_snapshot_seconds"} == {
        b'gpuwarden_user_memory_bytes{user="alice"}',
        b'gpuwarden_process_memory_bytes{container="",gpu="0",job_id="",pid="101",user="alice"}',
    }


def test_over_http(backend: SimBackend) -> None:
    registry = registry_for(backend, cache_seconds=600, pid_labels=True)
    server, thread = start(f"127.0.0.1:{free_port()}", registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            plain = r.read()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert plain == generate_latest(registry)
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(r.read()) == plain
        om = urllib.request.Request(
            url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(om, timeout=10) as r:
            body = r.read()
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert body == openmetrics_latest(registry)
        assert b"gpuwarden_process_memory_bytes{" in body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_kept_simulated_facts_make_the_same_snapshot(backend: SimBackend) -> None:
    fresh = SimBackend(backend.scenario, backend.registry.root)
    first = take_snapshot(fresh, now=5e9)  # every declared process's facts built
    assert take_snapshot(fresh, now=5e9) == first  # from the kept ones


def test_parts_render_as_one_registry_does() -> None:
    """The daemon's /metrics: its pass histogram, the snapshot's series, the queue's."""
    from prometheus_client import Gauge, Histogram

    before, after, whole = (CollectorRegistry(auto_describe=False) for _ in range(3))
    h = Histogram("gpuwarden_test_seconds", "A histogram", registry=before)
    h.observe(0.3)
    g = Gauge("gpuwarden_test_jobs", "Jobs", ["state"], registry=after)
    g.labels("queued").set(3)
    snap = snapshot([(gpu(0, used=3 * GiB), [proc(101, 0, GiB), proc(102, 0, 2 * GiB)])])
    c = SnapshotCollector(lambda: snap, cache_seconds=600)
    for part in (h, c, g):
        whole.register(part)
    assert render_text([before, c, after]) == generate_latest(whole)
    assert render_text([before, c, after]) == generate_latest(whole)  # kept parts
