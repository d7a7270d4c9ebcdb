"""``reap`` asks a zombie's parent to reap it with SIGCHLD. The parent is the one named
in the plan; by the time reap acts, that pid may be another process (the parent died,
its pid was reused). SIGCHLD goes only to the zombie's parent as the zombie names it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from gpuwarden.procs.terminate import signal_parent
from tests.helpers.procs import end_process
from tests.helpers.wait import wait_for

_RECORDER = """
import signal, sys, time
out = sys.argv[1]
signal.signal(signal.SIGCHLD, lambda s, f: open(out, "a").write("SIGCHLD\\n"))
open(out + ".ready", "w").close()
time.sleep(60)
"""

# A parent that never waits for its child: the child stays a zombie.
_NEGLECTFUL = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


def test_sigchld_goes_only_to_the_zombies_own_parent(tmp_path: Path) -> None:
    got = tmp_path / "signals"
    recorder = subprocess.Popen([sys.executable, "-c", _RECORDER, str(got)])
    parent = subprocess.Popen(
        [sys.executable, "-c", _NEGLECTFUL], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        zombie = int(parent.stdout.readline())
        wait_for(lambda: psutil.Process(zombie).status() == psutil.STATUS_ZOMBIE, timeout=10)
        wait_for(lambda: Path(f"{got}.ready").exists(), timeout=10)
        start = psutil.Process(zombie).create_time()
        # A stale plan: it names the recorder as the zombie's parent.
        assert signal_parent(recorder.pid, zombie, wait=0.2, child_start=start) == "parent_changed"
        time.sleep(0.3)
        assert not got.exists(), "SIGCHLD reached a process that is not the parent"
        # Its real parent is still asked (it ignores the nudge: the zombie stays).
        assert signal_parent(parent.pid, zombie, wait=0.2, child_start=start) == "still_zombie"
    finally:
        for p in (recorder, parent):
            end_process(p)
