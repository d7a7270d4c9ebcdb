"""procs/identity.py: the one process identity (pid + start time, boot, alive, signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gpuwarden.procs import identity
from gpuwarden.procs.identity import (
    START_TOLERANCE,
    alive,
    boot_id,
    identify,
    pin,
    running,
    same_boot,
    same_start,
    signal_if_same,
    start_ticks,
)
from tests.helpers.wait import wait_for


def test_same_start_has_one_tolerance() -> None:
    assert same_start(100.0, 100.0)
    assert same_start(100.0, 100.0 + START_TOLERANCE)  # a boot time read a second apart
    assert same_start(100.0 + START_TOLERANCE, 100.0)
    assert not same_start(100.0, 100.0 + START_TOLERANCE + 0.01)
    assert not same_start(None, 100.0)
    assert not same_start(100.0, None)


def test_start_ticks_reads_field_22() -> None:
    ticks = start_ticks(os.getpid())
    assert isinstance(ticks, int) and ticks > 0
    assert ticks == start_ticks(os.getpid())
    assert start_ticks(2**22 + 12345) is None  # no such pid (above pid_max)


def test_identify_this_process() -> None:
    me = psutil.Process()
    start, ticks = me.create_time(), start_ticks(me.pid)
    assert identify(me.pid, start) is not None
    assert identify(me.pid, None) is not None  # no start time: any process with the pid
    assert identify(me.pid, start - 100) is None  # the pid names another process
    assert identify(me.pid, start - 100, ticks) is not None  # ticks win where known
    assert identify(me.pid, start, (ticks or 0) + 1) is None
    assert identify(2**22 + 12345, start) is None


def test_unreadable_counts_as_the_recorded_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(self: psutil.Process) -> float:
        raise psutil.AccessDenied(self.pid)

    me = psutil.Process()
    start = me.create_time()
    monkeypatch.setattr(psutil.Process, "create_time", denied)
    monkeypatch.setattr(psutil.Process, "status", denied)
    assert identify(me.pid, start - 100) is not None
    assert alive(me.pid, start - 100)


def test_alive_and_zombies() -> None:
    me = psutil.Process()
    assert alive(me.pid, me.create_time())
    assert running(me)
    assert not alive(me.pid, me.create_time() - 100)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        start = psutil.Process(child.pid).create_time()
        wait_for(
            lambda: psutil.Process(child.pid).status(),
            10,
            0.02,
            until=lambda status: status == psutil.STATUS_ZOMBIE,
            what=lambda status: f"child {child.pid} is {status}, not a zombie",
        )
        assert identify(child.pid, start) is not None
        assert not alive(child.pid, start)  # a zombie is not alive: its memory is freed
    finally:
        child.wait()
    assert not alive(child.pid, start)


def test_boot_id(tmp_path: Path) -> None:
    real = boot_id()
    assert real and real == boot_id()
    f = tmp_path / "boot_id"
    f.write_text("abc-123\n")
    assert boot_id(f) == "abc-123"
    stat_file = tmp_path / "stat"
    stat_file.write_text("cpu 1 2 3\nbtime 1700000000\n")
    assert boot_id(tmp_path / "missing", stat_file) == "btime:1700000000"
    assert boot_id(tmp_path / "missing", tmp_path / "missing") == "unknown"


def test_same_boot() -> None:
    assert same_boot("a", "a")
    assert not same_boot("a", "b")
    assert same_boot(None, "b") and same_boot("unknown", "b") and same_boot("a", "unknown")
    assert same_boot(boot_id())


def test_signal_if_same_checks_identity_first() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = psutil.Process(child.pid).create_time()
        assert not signal_if_same(child.pid, start - 100, signal.SIGTERM)  # reused pid
        assert child.poll() is None
        assert signal_if_same(child.pid, start, signal.SIGTERM)
        wait_for(  # exited, not reaped
            lambda: psutil.Process(child.pid).status(),
            10,
            0.01,
            until=lambda status: status == psutil.STATUS_ZOMBIE,
            what=lambda status: f"child {child.pid} is {status}, not a zombie",
        )
        assert not signal_if_same(child.pid, start, signal.SIGTERM)  # a zombie: exited
        assert child.wait(10) == -signal.SIGTERM
        assert not signal_if_same(child.pid, start, signal.SIGTERM)  # reaped: gone
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_pin_without_pidfds(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError("no pidfds here")

    monkeypatch.setattr(identity.os, "pidfd_open", no_pidfd)
    t = pin(os.getpid(), psutil.Process().create_time())
    assert t is not None and t.fd is None
    t.send(0)  # by pid: signal 0 only checks it may be signalled
    t.close()
    assert pin(os.getpid(), psutil.Process().create_time() - 100) is None
