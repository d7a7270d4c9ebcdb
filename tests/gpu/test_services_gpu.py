"""Services on the real GPU (docs/services.md): three torch model servers with HTTP health
endpoints and budgets share one GPU beside a batch job; one is killed and restarted, one
runs out of memory and is restarted with a bigger budget, and a training job that does
not fit beside them waits instead of pushing them out."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_daemon import GpuDaemon

GiB = 1 << 30
# A model server: holds its weights (GIB), answers GET /health, writes its pid; when the
# file GROW exists it allocates ``extra`` GiB more (an oversized batch), as a server that
# gets a longer prompt does.
SERVER = r"""
import http.server, os, sys, threading, time, torch
gib, port, state, extra = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
held = [torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")]
held[0].fill_(1); torch.cuda.synchronize()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
open(state + ".pid", "w").write(str(os.getpid()))
while True:
    if extra and os.path.exists(state + ".grow"):
        held.append(torch.empty(int(extra * (1 << 30)), dtype=torch.uint8, device="cuda"))
        held[-1].fill_(1); torch.cuda.synchronize()
        os.rename(state + ".grow", state + ".grown")
    time.sleep(0.2)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _pid(state: Path, old: int | None = None) -> int | None:
    try:
        pid = int((state.parent / (state.name + ".pid")).read_text())
    except (OSError, ValueError):
        return None
    return pid if pid != old else None


@pytest.mark.gpu
def test_three_servers_share_the_gpu_restart_and_hold_their_room() -> None:
    pytest.importorskip("torch")
    d = GpuDaemon()
    work = d.root / "srv"
    work.mkdir()
    script = work / "server.py"
    script.write_text(SERVER)
    servers = {"llm": (20, 0), "embed": (6, 0), "rerank": (4, 4)}  # GiB, extra GiB on GROW
    ids: dict[str, int] = {}
    states = {name: work / name for name in servers}
    try:
        d.cli("daemon", "start")
        t0 = time.monotonic()
        for name, (gib, extra) in servers.items():
            port = _port()
            ids[name] = d.submit(
                "--name",
                name,
                "--mem",
                f"{gib + 1}G",
                "--qos",
                "guaranteed",
                "--restart",
                "on-failure",
                "--restart-limit",
                "3/10m",
                "--health-url",
                f"http://127.0.0.1:{port}/health",
                "--health-interval",
                "2s",
                "--health-grace",
                "30s",
                "--",
                sys.executable,
                str(script),
                str(gib),
                str(port),
                str(states[name]),
                str(extra),
            )
        for name in servers:
            _wait(
                f"{name} running",
                lambda n=name: d.job(ids[n])["state"] == "running" and _pid(states[n]),
                timeout=180,
            )
        print(f"three servers up in {time.monotonic() - t0:.1f} s")
        # A batch job beside them, and a training job that does not fit beside them.
        batch = d.submit(
            "--mem",
            "10G",
            "--",
            sys.executable,
            "-c",
            "import torch, time; x = torch.empty(8 << 30, dtype=torch.uint8, "
            "device='cuda'); x.fill_(1); time.sleep(4)",
        )
        total = json.loads(d.cli("status", "--json").stdout)["gpus"][0]["memory_total"]
        big = d.submit(
            "--mem",
            f"{(total - 30 * GiB) // GiB}G",
            "--priority",
            "100",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(1)",
        )
        # One server killed: restarted in place, healthy again.
        old = _pid(states["embed"])
        assert old is not None
        killed = time.monotonic()
        os.kill(old, signal.SIGKILL)
        _wait(
            "embed restarted",
            lambda: (
                d.job(ids["embed"])["restarts"] == 1
                and d.job(ids["embed"])["state"] == "running"
                and _pid(states["embed"], old)
            ),
        )
        print(f"embed back {time.monotonic() - killed:.1f} s after SIGKILL")
        # One server runs out of memory at its budget: restarted with a bigger one.
        (work / "rerank.grow").write_text("")
        _wait(
            "rerank OOM retried",
            lambda: (
                d.job(ids["rerank"])["oom_retries"] == 1
                and d.job(ids["rerank"])["state"] == "running"
            ),
            timeout=180,
        )
        _wait("rerank grown", lambda: (work / "rerank.grown").exists(), timeout=120)
        rerank = d.job(ids["rerank"])
        print(f"rerank budget {rerank['mem']} -> {rerank['budget']} bytes after its OOM")
        assert rerank["budget"] >= 8 * GiB + (1 << 30) // 2
        # The training job waited: no server was preempted for it.
        assert d.cli("wait", str(batch)).returncode == 0
        job = d.job(big)
        assert job["state"] in ("queued", "infeasible"), job
        for name in servers:
            s = d.job(ids[name])
            assert s["state"] == "running" and s["preemptions"] == 0, s
            print(
                name,
                "budget",
                s["budget"],
                "peak",
                s["peak_memory"],
                "restarts",
                s["restarts"],
                "health failures",
                s["health_failures"],
            )
        d.cli("cancel", str(big))
        for name in servers:
            d.cli("cancel", str(ids[name]))
        for name in servers:
            _wait(f"{name} stopped", lambda n=name: d.job(ids[n])["state"] == "cancelled")
    finally:
        d.stop()
