"""The /proc/*/fd scan against real processes holding real files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuwarden.procs.holders import scan_holders
from gpuwarden.procs.live import LiveProcesses
from tests.conftest import end_process

HOLD = (
    "import sys,time; fs=[open(p) for p in sys.argv[1:]]; print('ok', flush=True); time.sleep(60)"
)


def _hold(*paths: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, *map(str, paths)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline() == "ok\n"
    return p


def test_scan_finds_holders_and_their_devices(tmp_path: Path) -> None:
    dev = {name: tmp_path / name for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")}
    for p in dev.values():
        p.touch()
    files = {
        str(dev["nvidia0"]): 0,
        str(dev["nvidia1"]): 1,
        str(dev["nvidiactl"]): None,
        str(dev["nvidia-uvm"]): None,
    }
    cuda = _hold(dev["nvidiactl"], dev["nvidia-uvm"], dev["nvidia1"])
    monitor = _hold(dev["nvidiactl"])
    mine = open(dev["nvidia0"])  # noqa: SIM115 — this process holds one too, then is excluded
    try:
        raw = {h.pid: h.devices for h in scan_holders(files)}
        assert raw[cuda.pid] == tuple(
            sorted([str(dev["nvidia-uvm"]), str(dev["nvidia1"]), str(dev["nvidiactl"])])
        )
        assert raw[monitor.pid] == (str(dev["nvidiactl"]),)
        assert os.getpid() in raw
        assert os.getpid() not in {h.pid for h in scan_holders(files, exclude=[os.getpid()])}

        holders = {h.pid: h for h in LiveProcesses().holders(files, exclude=[os.getpid()])}
        assert holders[cuda.pid].gpu_indices == (1,) and holders[cuda.pid].uses_uvm
        assert not holders[cuda.pid].is_monitor
        assert holders[monitor.pid].is_monitor
        assert holders[cuda.pid].user and holders[cuda.pid].command
        # A re-check looks at the pids named alone: one that exited is simply not there.
        again = LiveProcesses().holders(files, only=[monitor.pid, 2**22 + 1])
        assert [h.pid for h in again] == [monitor.pid] and again[0].is_monitor
        assert {h.pid for h in scan_holders(files, only=[cuda.pid, os.getpid()])} == {
            cuda.pid,
            os.getpid(),
        }
    finally:
        mine.close()
        for p in (cuda, monitor):
            end_process(p)


def test_scan_of_nothing_is_empty() -> None:
    assert scan_holders({}) == []
