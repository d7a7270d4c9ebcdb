"""The live views on a real GPU: ``gpuwarden top`` (headless, 80x24) over real NVML shows
the GPU and a torch process with its memory, and the daemon's web feed charts a real
budgeted torch job's memory against its budget."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_daemon import GpuDaemon
from tests.helpers.procs import end_process
from tests.integration.daemon_fixture import free_port

GiB = 1 << 30
HOLD = (
    "import torch, time, sys; x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, "
    "device='cuda'); x.fill_(1); torch.cuda.synchronize(); print('ready', flush=True); "
    "time.sleep(float(sys.argv[2]))"
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]


def test_top_shows_the_gpu_and_a_torch_process_with_its_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if importlib.util.find_spec("textual") is None:
        pytest.skip("needs textual (carried as a wheel)")
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.tui.app import TopApp

    monkeypatch.delenv("GPUWARDEN_SIM", raising=False)
    monkeypatch.setenv("GPUWARDEN_HOME", str(tmp_path / "home"))  # no daemon there
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(3 * GiB), "120"], stdout=subprocess.PIPE, text=True
    )
    backend = open_backend()
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("ready")
        app = TopApp(backend, interval=0.5)
        seen: dict[str, Any] = {}

        async def main() -> None:
            async with app.run_test(size=(80, 24)) as pilot:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    await pilot.pause(0.2)
                    lines = app.gpu_text().plain.splitlines()
                    rows = _rows(app)
                    if any(str(holder.pid) in r for r in rows):
                        seen.update(lines=lines, rows=rows)
                        return

        asyncio.run(main())
        print(seen)
        assert seen, "the torch process never appeared"
        model = backend.gpus()[0].name.removeprefix("NVIDIA ").split()[0]  # H200, H100, ...
        assert model in seen["lines"][0] and len(seen["lines"][0]) <= 80
        row = next(r for r in seen["rows"] if str(holder.pid) in r)
        assert "3." in row and "running" in row, row  # 3 GiB + its CUDA context
    finally:
        end_process(holder)
        backend.close()


def backend_total(index: int) -> int:
    """What NVML says the GPU has (the web page shows the same figure)."""
    from gpuwarden.gpus.nvml import NvmlBackend

    backend = NvmlBackend.open()
    try:
        return next(g.memory_total for g in backend.gpus() if g.index == index)
    finally:
        backend.close()


def _rows(app: Any) -> list[str]:
    from textual.widgets import DataTable

    table: DataTable[Any] = app.query_one(DataTable)
    return [" ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]


def test_the_web_feed_charts_a_real_job_against_its_budget() -> None:
    port = free_port()
    d = GpuDaemon(f'history_interval = "500ms"\nweb_listen = "127.0.0.1:{port}"\n')
    try:
        d.cli("daemon", "start")
        job = d.submit(
            "--mem", "6G", "--name", "holder", "--", sys.executable, "-c", HOLD, str(4 * GiB), "6"
        )
        d.cli("wait", str(job))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui/data/jobs/{job}", timeout=10) as r:
            page = json.loads(r.read())
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/ui/data/overview?hours=1", timeout=10
        ) as r:
            overview = json.loads(r.read())
        print("timeline", page["timeline"], "budget", page["budget"])
        assert page["budget"] == 6 * GiB and page["job"]["state"] == "succeeded"
        peak = max(page["timeline"]["used"])
        assert 4 * GiB < peak <= 6 * GiB, peak  # 4 GiB + the CUDA context, within budget
        layers = overview["gpus"][0]["layers"]
        assert max(layers[f"job {job} (root)"]) == peak
        assert overview["gpus"][0]["total"] == backend_total(0)
    finally:
        d.stop()
