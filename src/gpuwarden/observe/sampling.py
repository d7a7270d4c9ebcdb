"""Several snapshots a short interval apart, for findings that must persist (not blips)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuwarden.observe.leaks import find_leaks
from gpuwarden.observe.snapshot import Snapshot, take_snapshot

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend


def sample_suspects(
    backend: Backend,
    samples: int,
    interval: float,
    threshold: int,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Snapshot]:
    """``samples`` snapshots ``interval`` seconds apart, oldest first, as ``find_leaks``
    needs them to tell a leak from a blip, at the cost of one snapshot and a re-check
    of what it found suspicious. A leak must be found in every sample, so what the first
    does not show cannot be one: with nothing suspicious, the first snapshot is the
    answer at once; otherwise each later sample reads the driver's figures anew, and
    /proc and the open device files only for the suspects' pids (the other processes
    keep the facts the first read, which no finding can rest on). A monitor (NVML alone
    open: nvidia-smi, an exporter, this daemon) is no leak and no reason to wait: when
    it is all there is, it is reported as the first sample found it."""
    first = take_snapshot(backend)
    suspects = find_leaks([first], threshold)
    if samples <= 1 or all(lk.kind == "monitor" for lk in suspects):
        return [first]
    pids = {lk.pid for lk in suspects if lk.pid is not None}
    known = {p.pid: p.info for g in first.gpus for p in g.processes if p.pid not in pids}
    holders = {
        lk.pid for lk in suspects if lk.kind in ("hidden_holder", "monitor") and lk.pid is not None
    }
    out = [first]
    for _ in range(samples - 1):
        sleep(interval)
        out.append(take_snapshot(backend, known=known, holder_pids=holders))
    return out
