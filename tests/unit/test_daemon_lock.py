"""The daemon's lock: one daemon per state directory, and a daemon started the moment
the last one died waits the few milliseconds its lock takes to come free (its pid reads
as gone while its other threads are still ending). Real processes, a real flock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwarden.client.paths import resolve_paths
from gpuwarden.daemon.main import AlreadyRunning, take_lock

# Takes the lock, names PID in it, says so, holds it for SECONDS, then exits.
HOLDER = """
import fcntl, sys, time
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX)
f.seek(0); f.truncate(); f.write(sys.argv[2] + "\\n"); f.flush()
print("held", flush=True)
time.sleep(float(sys.argv[3]))
"""


def _hold(lock: Path, named: int, seconds: float) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(named), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p


def _gone_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_lock_of_a_daemon_gone_is_waited_for(tmp_path: Path) -> None:
    paths = resolve_paths({"GPUWARDEN_HOME": str(tmp_path)})
    holder = _hold(paths.lock, _gone_pid(), 0.3)  # names a process that has exited
    try:
        began = time.monotonic()
        f = take_lock(paths)
        waited = time.monotonic() - began
    finally:
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    f.close()
    assert 0.1 < waited < 0.9, waited  # until the holder let go, within the wait


def test_a_daemon_that_runs_keeps_its_lock_and_the_second_says_so_at_once(
    tmp_path: Path,
) -> None:
    paths = resolve_paths({"GPUWARDEN_HOME": str(tmp_path)})
    holder = _hold(paths.lock, 0, 5.0)
    try:
        with open(paths.lock, "w") as f:  # the holder names itself, as a daemon does
            f.write(f"{holder.pid}\n")
        began = time.monotonic()
        with pytest.raises(AlreadyRunning, match="already runs"):
            take_lock(paths)
        assert time.monotonic() - began < 0.5  # no wait for a daemon that runs
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
