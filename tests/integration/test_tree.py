"""procs/tree.py on real processes, in a child of its own (it ends every descendant of
the process that calls it): a subreaper keeps the orphans of what it starts, and
ending its tree takes those too, with SIGKILL for what ignores SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil

from tests.helpers.paths import SRC

SCRIPT = r"""
import json, subprocess, sys, time
from gpuwarden.procs.tree import become_subreaper, end_descendants
assert become_subreaper()
# A shell that leaves an orphan ignoring SIGTERM, and exits: the orphan is ours now.
subprocess.run(["sh", "-c", "trap '' TERM; (trap '' TERM; exec sleep 60) & echo $!"],
               stdout=open("pid", "w"), check=True)
plain = subprocess.Popen(["sleep", "60"])
time.sleep(0.3)
orphan = int(open("pid").read())
left, stuck = end_descendants(grace=0.5, kill_wait=5.0)
print(json.dumps({"orphan": orphan, "plain": plain.pid, "left": left, "stuck": stuck}))
"""


def test_a_subreaper_ends_its_whole_tree_orphans_and_term_ignorers_included(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=str(tmp_path),
        text=True,
        capture_output=True,
        timeout=30,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {out["orphan"], out["plain"]} <= set(out["left"]) and out["stuck"] == []
    for pid in (out["orphan"], out["plain"]):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
