"""The lasting /proc facts of a process (namespace pids, container, environment, torch)
are read once per process and reused by later snapshots, as long as it is the same
process: an exec (same pid and start time, new command) reads them again, and a process
gone loses them. Kept facts equal a fresh read for every process on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpuwarden.procs.live import KeptFacts, LiveProcesses
from gpuwarden.procs.model import ProcInfo
from tests.helpers.procs import end_process

EXEC_ON_LINE = (
    "import os, sys\n"
    "sys.stdin.readline()\n"
    "os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(6' + '1)'],"
    " dict(os.environ, GPUWARDEN_JOB='8'))\n"
)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(
        [sys.executable, "-c", EXEC_ON_LINE],
        stdin=subprocess.PIPE,
        env=dict(os.environ, GPUWARDEN_JOB="7"),
    )
    yield p
    end_process(p)


def lasting(i: ProcInfo) -> tuple[object, ...]:
    return (
        i.exists,
        i.start_time,
        i.user,
        i.uid,
        i.command,
        i.name,
        i.container,
        i.nspid,
        i.env,
        i.uses_torch,
    )


def wait_for_command(pid: int, kept: KeptFacts, word: str) -> ProcInfo:
    for _ in range(200):
        info = LiveProcesses(kept).info(pid)
        if word in (info.command or ""):
            return info
        os.sched_yield()
        subprocess.run(["sleep", "0.02"], check=True)
    raise AssertionError(f"{pid} never ran {word}")


def test_reused_while_the_same_process_read_again_after_exec(
    child: subprocess.Popen[bytes],
) -> None:
    kept = KeptFacts()
    first = wait_for_command(child.pid, kept, "readline")
    assert first.env == {"GPUWARDEN_JOB": "7"}
    assert len(kept) == 1
    again = LiveProcesses(kept).info(child.pid)
    assert again.env is first.env  # kept, not read again
    assert lasting(again) == lasting(first)
    assert child.stdin is not None
    child.stdin.write(b"\n")
    child.stdin.flush()
    after = wait_for_command(child.pid, kept, "sleep(61)")  # not in the first's
    assert after.start_time == first.start_time
    assert after.env == {"GPUWARDEN_JOB": "8"}  # the exec'd environment, read anew


def test_a_process_gone_loses_its_facts(child: subprocess.Popen[bytes]) -> None:
    kept = KeptFacts()
    LiveProcesses(kept).info(child.pid)
    LiveProcesses(kept).holders({})
    assert len(kept) == 1
    child.kill()
    child.wait()
    LiveProcesses(kept).holders({})  # a snapshot's holder scan lists /proc
    assert len(kept) == 0


def test_bounded() -> None:
    kept = KeptFacts(limit=3)
    me = LiveProcesses(kept)
    for pid in [int(n) for n in os.listdir("/proc") if n.isdigit()][:20]:
        me.info(pid)
        LiveProcesses(kept).info(pid)
        assert len(kept) <= 3


def test_kept_facts_equal_a_fresh_read_for_every_process() -> None:
    kept = KeptFacts()
    pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
    for pid in pids:
        LiveProcesses(kept).info(pid)
    compared = 0
    for pid in pids:
        reused = LiveProcesses(kept).info(pid)
        fresh = LiveProcesses(KeptFacts()).info(pid)
        if not (reused.exists and fresh.exists) or reused.start_time != fresh.start_time:
            continue  # gone or replaced meanwhile
        assert lasting(reused) == lasting(fresh), pid
        compared += 1
    assert compared >= 3


def test_maps_without_torch_are_looked_at_again_now_and_then(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process without torch may load it later, so its maps are read again; but not on
    every snapshot (a CUDA program's run to thousands of lines): once per recheck."""
    import gpuwarden.procs.live as live

    reads: list[int] = []
    real = live._uses_torch

    def counted(pid: int) -> bool | None:
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(live, "_uses_torch", counted)
    now = [100.0]
    kept = KeptFacts(torch_recheck=30.0, clock=lambda: now[0])
    first = LiveProcesses(kept).info(child.pid)
    assert first.uses_torch is False and reads == [child.pid]
    for _ in range(3):
        now[0] += 10.0  # 10, 20, 30 s later: the last one is due
        assert LiveProcesses(kept).info(child.pid).uses_torch is False
    assert reads == [child.pid, child.pid]
    now[0] += 29.0
    LiveProcesses(kept).info(child.pid)
    assert len(reads) == 2  # not yet due again
    now[0] += 1.0
    LiveProcesses(kept).info(child.pid)
    assert len(reads) == 3
