"""Several snapshots a short interval apart, for findings that must persist (not blips)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuwarden.observe.snapshot import Snapshot, take_snapshot

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend


def sample(backend: Backend, samples: int, interval: float,
           sleep: Callable[[float], None] = time.sleep) -> list[Snapshot]:
    """``samples`` snapshots, oldest first, ``interval`` seconds apart."""
    out = [take_snapshot(backend)]
    for _ in range(max(samples, 1) - 1):
        sleep(interval)
        out.append(take_snapshot(backend))
    return out
