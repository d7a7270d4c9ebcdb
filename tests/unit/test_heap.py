"""HeapTrimmer gives freed heap back to the system, at most once per period."""

from __future__ import annotations

import gc
from pathlib import Path

import psutil
import pytest

from gpuwarden.daemon.heap import HeapTrimmer
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import JobSpec


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


def test_a_big_listing_freed_goes_back_to_the_system(tmp_path: Path) -> None:
    """What a daemon's deep queue leaves: 3,000 jobs listed with their environments and
    freed keep half their memory in the process (glibc keeps it) until the trim."""
    h = HeapTrimmer(every=0.0)
    if not h.available:
        pytest.skip("this C library has no malloc_trim")
    store = Store(tmp_path / "state.db", synchronous="NORMAL")
    env = {f"VAR{i}": "x" * 40 for i in range(40)}
    for i in range(3000):
        store.submit(JobSpec(command=("true",), user="u", uid=1, gid=1, env=env), float(i))
    me = psutil.Process()
    gc.collect()
    h.maybe_trim()
    base = me.memory_info().rss
    jobs = store.list()
    assert me.memory_info().rss > base + 30e6
    del jobs
    gc.collect()
    kept = me.memory_info().rss - base
    h.maybe_trim()
    assert me.memory_info().rss - base < min(kept / 2, 10e6)
    store.close()
