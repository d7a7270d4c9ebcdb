"""CPU and latency of the live views on 8 simulated GPUs × 200 processes
(bench/gen_scenario.py).

(a) ``gpuwarden top --interval 1`` in a pseudo-terminal (80×24) for ``--seconds``, beside
    what people do instead: ``gpuwarden status`` run once a second (``watch -n 1``). CPU
    per refresh of each after a warm-up, and their ratio; each refresh of top takes a
    full snapshot, as each run of status does.
(b) The web page's data from a real daemon whose store holds 24 h of samples at the
    default 10 s for the 8 GPUs and 40 jobs (written before it starts): latency, size and
    the daemon's CPU of ``/ui/data/overview`` for 1, 6 and 24 hours over the anonymous
    ``web_listen``: the first request (which draws the charts) and the next ones (p50,
    p99; the charts come from the daemon's cache for one point's duration).

    python bench/bench_views.py --json bench/results/views.json
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pty
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from _common import percentile

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
PY = sys.executable
GiB = 1 << 30


def _env(tmp: Path, scenario: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_"))}
    env.update(
        GPUWARDEN_SIM=str(scenario),
        GPUWARDEN_SIM_STATE=str(tmp / "sim"),
        GPUWARDEN_HOME=str(tmp / "home"),
        PYTHONPATH=str(SRC),
        COLUMNS="80",
        LINES="24",
        TERM="xterm-256color",
    )
    return env


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def top_cpu(env: dict[str, str], seconds: float, warmup: float) -> dict[str, Any]:
    """Run top in a pty, reading its screen as a terminal would; CPU after the warm-up."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: top, on the pty
        os.execvpe(PY, [PY, "-m", "gpuwarden", "top", "--interval", "1"], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = psutil.Process(pid)
    started = time.monotonic()
    marks: dict[str, float] = {}
    received = 0
    while time.monotonic() - started < seconds:
        if "warm" not in marks and time.monotonic() - started >= warmup:
            marks["warm"], marks["warm_at"] = _cpu(proc), time.monotonic()
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                received += len(os.read(fd, 1 << 16))
            except OSError:
                break
    end_cpu, end_at = _cpu(proc), time.monotonic()
    os.write(fd, b"q")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        select.select([fd], [], [], 0.05)
        with contextlib.suppress(OSError):
            os.read(fd, 1 << 16)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.close(fd)
    span = end_at - marks["warm_at"]
    cpu = end_cpu - marks["warm"]
    return {
        "seconds": span,
        "cpu_seconds": cpu,
        "cpu_per_refresh": cpu / span,
        "startup_cpu": marks["warm"],
        "screen_bytes": received,
    }


def status_loop_cpu(env: dict[str, str], seconds: float) -> dict[str, Any]:
    """``gpuwarden status`` once a second, as ``watch -n 1`` runs it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    runs, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        tick = time.monotonic()
        subprocess.run(
            [PY, "-m", "gpuwarden", "status"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        runs += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"runs": runs, "cpu_seconds": cpu, "cpu_per_refresh": cpu / runs}


def fill_history(home: Path, scenario: Path, hours: float, jobs: int) -> dict[str, Any]:
    """The store a daemon that ran ``hours`` would have: samples every 10 s per GPU, a
    few jobs on each GPU at a time, the rest of the memory others'."""
    sys.path.insert(0, str(SRC))
    from gpuwarden.daemon.history import GpuSample
    from gpuwarden.daemon.store import Store
    from gpuwarden.jobs.model import CANCELLED, QUEUED, JobSpec
    from gpuwarden.units import parse_size

    gpus = json.loads(scenario.read_text())["gpus"]
    home.mkdir(parents=True, exist_ok=True)
    now = int(time.time())
    start = now - int(hours * 3600)
    with Store(home / "state.db") as store:
        ids = []
        for i in range(jobs):
            job, _ = store.submit(
                JobSpec(
                    command=("python", "train.py", f"--run={i}"),
                    user=f"user{i % 7}",
                    uid=1000 + i % 7,
                    gid=1000,
                    name=f"run-{i}",
                    mem=8 * GiB,
                ),
                float(start),
            )
            store.transition(
                job.id,
                (QUEUED,),
                CANCELLED,
                now=float(start),
                kind="cancelled",
                ended_at=float(start),
            )
            ids.append(job.id)
        rows = 0
        batch: list[GpuSample] = []
        for ts in range(start, now, 10):
            for g, gpu in enumerate(gpus):
                total = parse_size(gpu["memory_total"])
                slot = (ts - start) // 1800  # jobs change every half hour
                on = [ids[(g * 5 + slot + k) % len(ids)] for k in range(4)]
                used = {j: (4 + (j + ts // 600) % 8) * GiB for j in on}
                batch.append(
                    GpuSample(
                        ts=ts,
                        uuid=gpu["uuid"],
                        index=g,
                        total=total,
                        used=sum(used.values()) + 6 * GiB,
                        leaked=GiB if slot % 5 == 0 else 0,
                        jobs=used,
                        users={"svc-infer": 5 * GiB},
                    )
                )
            if len(batch) >= 8000:
                store.record_samples(batch, keep=hours * 3600 + 60, now=float(now))
                rows += len(batch)
                batch = []
        store.record_samples(batch, keep=hours * 3600 + 60, now=float(now))
        rows += len(batch)
    return {"hours": hours, "gpus": len(gpus), "jobs": jobs, "samples": rows}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def web_latency(env: dict[str, str], home: Path, requests: int) -> dict[str, Any]:
    port = _free_port()
    (home / "config.toml").write_text(f'web_listen = "127.0.0.1:{port}"\nhistory_interval = "0"\n')
    subprocess.run(
        [PY, "-m", "gpuwarden", "daemon", "start"],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        daemon = psutil.Process(int((home / "daemon.lock").read_text().split()[0]))
        url = f"http://127.0.0.1:{port}/ui/data/overview"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ui/", timeout=10).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        out: dict[str, Any] = {}
        for hours in (1, 6, 24):
            times, cpus, size = [], [], 0
            for _ in range(requests):
                cpu0, t0 = _cpu(daemon), time.perf_counter()
                body = urllib.request.urlopen(f"{url}?hours={hours}", timeout=60).read()
                times.append(time.perf_counter() - t0)
                cpus.append(_cpu(daemon) - cpu0)
                size = len(body)
            # The first request draws the charts; the others, within one point's
            # duration, get them from the daemon's chart cache (the queue is read anew).
            out[str(hours)] = {
                "first": times[0],
                "first_cpu": cpus[0],
                "p50": percentile(times[1:], 50),
                "p99": percentile(times[1:], 99),
                "bytes": size,
                "cpu_per_request": sum(cpus[1:]) / len(cpus[1:]),
            }
        return out
    finally:
        subprocess.run(
            [PY, "-m", "gpuwarden", "daemon", "stop"], env=env, capture_output=True, timeout=60
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=40.0, help="top and status, each")
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--requests", type=int, default=30, help="per history window")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gwv-") as raw:
        tmp = Path(raw)
        scenario = tmp / "scenario.json"
        subprocess.run(
            [PY, str(HERE / "gen_scenario.py"), "-o", str(scenario)],
            check=True,
            capture_output=True,
        )
        env = _env(tmp, scenario)
        top = top_cpu(env, args.seconds, args.warmup)
        status = status_loop_cpu(env, args.seconds - args.warmup)
        history = fill_history(tmp / "home", scenario, 24.0, 40)
        web = web_latency(env, tmp / "home", args.requests)
    result = {
        "scenario": {"gpus": 8, "processes": 1600},
        "top": top,
        "status_loop": status,
        "ratio_status_over_top": status["cpu_per_refresh"] / top["cpu_per_refresh"],
        "history": history,
        "web": web,
    }
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
