"""Scrape latency and CPU cost of ``gpuwarden exporter`` on 8 simulated GPUs × 200
processes (bench/gen_scenario.py), as Prometheus would scrape it.

(a) In-process, cache off: one snapshot + text rendering as the exporter does it
    (``SnapshotCollector.render_text``), with and without the /proc device-file scan
    (``--no-holders``), and without pid labels; and prometheus_client's own
    ``generate_latest`` of the same collector, the same bytes.
(b) A real exporter process scraped over HTTP: p50/p99 of the full request, cache at the
    default 1 s and scrapes 1 s apart (every scrape takes a fresh snapshot), then the
    exporter's CPU time over that period as a share of one core; once asking for plain
    text, once with the headers Prometheus sends (OpenMetrics preferred, gzip).

    python bench/bench_metrics.py --json bench/results/metrics.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]  # nearest rank


def in_process(scenario: Path, runs: int) -> dict[str, Any]:
    sys.path.insert(0, str(SRC))
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuwarden.gpus.sim import SimBackend
    from gpuwarden.metrics.collector import SnapshotCollector
    from gpuwarden.observe.snapshot import take_snapshot
    from gpuwarden.procs.holders import keep_fd_tables

    keep_fd_tables()  # as ``gpuwarden exporter`` does
    backend = SimBackend.from_file(scenario)
    out: dict[str, Any] = {}
    for name, holders, pids, own in (
        ("with holder scan", True, True, True),
        ("without holder scan", False, True, True),
        ("without pid labels", True, False, True),
        ("with holder scan, generate_latest", True, True, False),
    ):
        reg = CollectorRegistry(auto_describe=False)
        collector = SnapshotCollector(
            lambda h=holders: take_snapshot(backend, holders=h),  # type: ignore[misc]
            cache_seconds=0,
            pid_labels=pids,
        )
        reg.register(collector)
        render = collector.render_text if own else lambda r=reg: generate_latest(r)
        render()  # the first render reads every process's lasting facts
        times, size = [], 0
        for _ in range(runs):
            t = time.perf_counter()
            body = render()
            times.append(time.perf_counter() - t)
            size = len(body)
        out[name] = {
            "p50": statistics.median(times),
            "p99": pct(times, 0.99),
            "bytes": size,
            "series": body.count(b"\n") - body.count(b"\n#"),
        }
    out.update(render_only(backend, runs))
    return out


def render_only(backend: Any, runs: int) -> dict[str, Any]:
    """The rendering alone, from snapshots taken beforehand: the same snapshot every
    time (nothing changed: each family's text is kept), and two that differ in every
    process's memory and SM share taken in turn (every per-process series changed)."""
    from dataclasses import replace

    from gpuwarden.metrics.collector import SnapshotCollector
    from gpuwarden.observe.snapshot import take_snapshot

    a = take_snapshot(backend, holders=True)
    b = replace(
        a,
        gpus=tuple(
            replace(
                g,
                processes=tuple(
                    p._replace(
                        gpu=p.gpu._replace(
                            memory=(p.gpu.memory or 0) + (1 << 20),
                            sm_utilization=((p.gpu.sm_utilization or 0) + 1) % 100,
                        ),
                    )
                    for p in g.processes
                ),
            )
            for g in a.gpus
        ),
    )
    out: dict[str, Any] = {}
    for name, snaps in (
        ("render only, nothing changed", (a, a)),
        ("render only, every process's figures changed", (a, b)),
    ):
        turns = itertools.cycle(snaps)
        collector = SnapshotCollector(lambda t=turns: next(t), cache_seconds=0)  # type: ignore[misc]
        collector.render_text()
        times, body = [], b""
        for _ in range(runs):
            t = time.perf_counter()
            body = collector.render_text()
            times.append(time.perf_counter() - t)
        out[name] = {
            "p50": statistics.median(times),
            "p99": pct(times, 0.99),
            "bytes": len(body),
            "series": body.count(b"\n") - body.count(b"\n#"),
        }
    return out


# What Prometheus (2.x) sends with every scrape: it prefers OpenMetrics, and gzip.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def over_http(
    scenario: Path, scrapes: int, interval: float, headers: dict[str, str]
) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env.update(
        GPUWARDEN_SIM=str(scenario), GPUWARDEN_SIM_STATE=tempfile.mkdtemp(), PYTHONPATH=str(SRC)
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "exporter", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(100):
            try:  # the warm-up in the format measured: a format's first render costs more
                urllib.request.urlopen(
                    urllib.request.Request(url, headers=headers), timeout=5
                ).read()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(interval)
        p = psutil.Process(proc.pid)
        cpu0, wall0 = sum(p.cpu_times()[:2]), time.monotonic()
        times = []
        for _ in range(scrapes):
            t = time.perf_counter()
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=10
            ) as r:
                size = len(r.read())
            took = time.perf_counter() - t
            times.append(took)
            time.sleep(max(interval - took, 0))
        cpu = sum(p.cpu_times()[:2]) - cpu0
        wall = time.monotonic() - wall0
    finally:
        proc.terminate()
        proc.wait(10)
    return {
        "scrapes": scrapes,
        "interval": interval,
        "headers": headers,
        "bytes": size,
        "p50": statistics.median(times),
        "p99": pct(times, 0.99),
        "max": max(times),
        "cpu_share": cpu / wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--scrapes", type=int, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    scenario = Path(tempfile.mkdtemp()) / "8x200.json"
    subprocess.run(
        [
            sys.executable,
            str(HERE / "gen_scenario.py"),
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
    os.environ["GPUWARDEN_SIM_STATE"] = tempfile.mkdtemp()
    result = {
        "scenario": "bench/gen_scenario.py --gpus 8 --per-gpu 200 --seed 1",
        "cpus": os.cpu_count(),
        "loadavg": Path("/proc/loadavg").read_text().strip(),
        "in_process": in_process(scenario, args.runs),
        "http": over_http(scenario, args.scrapes, args.interval, {}),
        "http_prometheus": over_http(scenario, args.scrapes, args.interval, PROMETHEUS_HEADERS),
    }
    for name, r in result["in_process"].items():
        print(
            f"collect+render {name}: p50 {r['p50'] * 1000:.1f} ms, p99 "
            f"{r['p99'] * 1000:.1f} ms, {r['series']} series, {r['bytes']} bytes",
            file=sys.stderr,
        )
    for how in ("http", "http_prometheus"):
        h = result[how]
        print(
            f"{how} scrape every {h['interval']:g}s: p50 {h['p50'] * 1000:.1f} ms, p99 "
            f"{h['p99'] * 1000:.1f} ms, {h['bytes']} bytes; exporter CPU "
            f"{h['cpu_share'] * 100:.1f}% of a core",
            file=sys.stderr,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
