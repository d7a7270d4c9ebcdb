"""Function types the queue's policies share (kept apart so policy modules need not
import the pass that uses them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gpuwarden.sched.model import GpuState, Place, QueuedJob

Ordering = Callable[[Iterable[QueuedJob]], list[QueuedJob]]
"""Turns the queue into the order a pass considers it in."""
Fit = Callable[[QueuedJob, Sequence[GpuState], float], Place | None]
"""Where one job fits given the GPU states, or None (``placement.fits``)."""
