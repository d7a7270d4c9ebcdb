"""HeapTrimmer gives freed heap back to the system, at most once per period."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.daemon.heap import HeapTrimmer


def test_trims_at_most_once_per_period() -> None:
    now = [100.0]
    h = HeapTrimmer(every=10.0, clock=lambda: now[0])
    if not h.available:
        pytest.skip("this C library has no malloc_trim")
    assert h.maybe_trim()
    now[0] = 105.0
    assert not h.maybe_trim()
    now[0] = 110.0
    assert h.maybe_trim()


# Run in a fresh interpreter: a test worker's heap already holds what earlier tests freed,
# and the listing would grow into that instead of asking the system for more.
_LISTING = """
import gc, json, sys
import psutil
from gpuwarden.daemon.heap import HeapTrimmer
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import JobSpec

h = HeapTrimmer(every=0.0)
if not h.available:
    print(json.dumps(None))
    sys.exit(0)
store = Store(sys.argv[1], synchronous="NORMAL")
env = {f"VAR{i}": "x" * 40 for i in range(40)}
for i in range(3000):
    store.submit(JobSpec(command=("true",), user="u", uid=1, gid=1, env=env), float(i))
me = psutil.Process()
gc.collect()
h.maybe_trim()
base = me.memory_info().rss
jobs = store.list()
listed = me.memory_info().rss - base
del jobs
gc.collect()
kept = me.memory_info().rss - base
h.maybe_trim()
trimmed = me.memory_info().rss - base
store.close()
print(json.dumps({"listed": listed, "kept": kept, "trimmed": trimmed}))
"""


def test_a_big_listing_freed_goes_back_to_the_system(tmp_path: Path) -> None:
    """What a daemon's deep queue leaves: 3,000 jobs listed with their environments and
    freed keep half their memory in the process (glibc keeps it) until the trim."""
    out = subprocess.run(
        [sys.executable, "-c", _LISTING, str(tmp_path / "state.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(out.stdout)
    if figures is None:
        pytest.skip("this C library has no malloc_trim")
    assert figures["listed"] > 30e6
    assert figures["trimmed"] < min(figures["kept"] / 2, 10e6)
