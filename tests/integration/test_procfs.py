"""procs/procfs.py reads what psutil reads, the same way: every process of this machine
is read by both and must agree (the lasting facts to the bit; what moves while the test
runs, within what can move between the two reads)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from gpuwarden.procs import procfs
from gpuwarden.procs.live import KeptFacts, LiveProcesses
from tests.helpers.procs import end_process


def _psutil_facts(pid: int) -> procfs.Facts | None:
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            name = p.name()
            try:
                cmd = " ".join(p.cmdline()) or f"[{name}]"
            except (psutil.AccessDenied, psutil.ZombieProcess):
                cmd = f"[{name}]"
            times = p.cpu_times()
            return procfs.Facts(
                uid=p.uids().real,
                status=p.status(),
                ppid=p.ppid(),
                pgid=os.getpgid(pid),
                start=p.create_time(),
                name=name,
                command=cmd,
                rss=int(p.memory_info().rss),
                cpu_time=float(times.user + times.system),
            )
    except (psutil.Error, OSError):
        return None


def test_every_process_reads_as_psutil_reads_it() -> None:
    compared = 0
    for pid in sorted(int(n) for n in os.listdir("/proc") if n.isdigit()):
        theirs = _psutil_facts(pid)
        try:
            mine = procfs.read(pid, procfs.boot_time())
        except OSError:
            continue  # gone meanwhile
        again = _psutil_facts(pid)
        if theirs is None or again is None or theirs.start != again.start:
            continue  # gone or replaced meanwhile
        lasting = (theirs.uid, theirs.ppid, theirs.pgid, theirs.name, theirs.command)
        if lasting != (again.uid, again.ppid, again.pgid, again.name, again.command):
            continue  # it exec'd, was reparented or changed its group between the reads
        assert (mine.uid, mine.ppid, mine.pgid, mine.name, mine.command) == lasting, pid
        assert abs(mine.start - theirs.start) < 1e-6, pid
        assert theirs.cpu_time <= mine.cpu_time + 1e-9 <= again.cpu_time + 2e-9, pid
        if theirs.rss == again.rss:
            assert mine.rss == theirs.rss, pid
        if theirs.status == again.status:
            assert mine.status == theirs.status, pid
        compared += 1
    assert compared >= 10


READY = "import time; print('ok', flush=True); time.sleep(60)"


@pytest.mark.parametrize("argv0", ["a-very-long-program-name", "py"], ids=["cut", "short"])
def test_names_and_command_lines_as_psutil_says_them(argv0: str) -> None:
    """A name the kernel cuts at 15 characters (psutil takes the command's instead),
    an argument with spaces and one that is not UTF-8."""
    link = f"/tmp/{argv0}-{os.getpid()}"
    os.symlink(sys.executable, link)
    try:
        p = subprocess.Popen(
            [link, "-c", READY, "arg with spaces", os.fsdecode(b"caf\xe9")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert p.stdout is not None and p.stdout.readline() == "ok\n"
            mine = procfs.read(p.pid, procfs.boot_time())
            theirs = _psutil_facts(p.pid)
            assert theirs is not None
            assert (mine.name, mine.command) == (theirs.name, theirs.command)
            assert mine.name == os.path.basename(link)
            info = LiveProcesses(KeptFacts()).info(p.pid)
            assert (info.name, info.command, info.uid) == (theirs.name, theirs.command, theirs.uid)
        finally:
            end_process(p)
    finally:
        os.unlink(link)


@pytest.mark.parametrize(
    ("raw", "argv"),
    [
        ("python\x00-c\x00pass\x00", ["python", "-c", "pass"]),
        ("nginx: worker process", ["nginx:", "worker", "process"]),  # a title, no NULs
        ("postgres: checkpointer \x00", ["postgres:", "checkpointer", ""]),
        ("", []),
    ],
)
def test_a_command_line_is_split_as_psutil_splits_it(raw: str, argv: list[str]) -> None:
    assert procfs._split_cmdline(raw) == argv


def test_a_zombie_and_a_process_gone() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        psutil.Process(p.pid)  # still ours to reap: a zombie once it exits
        for _ in range(200):
            if procfs.state(p.pid) == "zombie":
                break
            os.sched_yield()
            subprocess.run(["sleep", "0.01"], check=True)
        info = LiveProcesses(KeptFacts()).info(p.pid)
        assert info.exists and info.status == "zombie" and info.is_zombie
        assert info.command == f"[{info.name}]"  # a zombie has no command line left
    finally:
        p.wait()
    gone = LiveProcesses(KeptFacts()).info(p.pid)
    assert not gone.exists
    assert procfs.state(p.pid) is None
