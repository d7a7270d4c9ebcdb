"""Headroom: what each GPU can still promise, the memory side of invariant 1
(docs/design.md). A GPU's headroom is total − reserve − Σ managed (budget + CUDA
context allowance, or what a job uses when that is more) − foreign peak × (1 + spike
buffer). This module reads a Snapshot into the GPU states the policies work on
(``gpu_states``: managed jobs, foreign processes and memory no process accounts for)
and does that arithmetic, to the byte; which GPUs a job gets is placement.py's."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import replace
from fractions import Fraction

from gpuwarden.gpus.model import GpuFacts
from gpuwarden.gpus.visible import mig_device
from gpuwarden.observe.snapshot import RUNNING, GpuView, Snapshot
from gpuwarden.sched.model import GpuState, ManagedUse
from gpuwarden.units import MiB

DEFAULT_RESERVE = 512 * MiB
"""Per-GPU bytes never given to jobs: the driver's own allocations."""
DEFAULT_SPIKE_BUFFER = 0.1
"""Foreign processes are charged at their peak plus this fraction: they may grow again."""


# --- the arithmetic ----------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _spike_ratio(spike_buffer: float) -> tuple[int, int]:
    """1 + spike as an exact fraction of the decimal the user wrote (0.1 is 1/10, not the
    binary float just above it)."""
    if not math.isfinite(spike_buffer) or spike_buffer < 0:
        raise ValueError(f"spike buffer must be a finite fraction ≥ 0, not {spike_buffer}")
    ratio = 1 + Fraction(repr(float(spike_buffer)))
    return ratio.numerator, ratio.denominator


def foreign_charge(foreign_peak: int, spike_buffer: float) -> int:
    """``foreign_peak × (1 + spike_buffer)`` rounded up, in integers so the invariant
    holds to the byte, not to a float's rounding."""
    num, den = _spike_ratio(spike_buffer)
    return -(-max(foreign_peak, 0) * num // den)


def capacity(gpu: GpuState) -> int:
    """The largest budget this GPU could give one job when empty: total − reserve − the
    job's CUDA context."""
    return max(gpu.total - gpu.reserve - gpu.context, 0)


def headroom(gpu: GpuState, spike_buffer: float = DEFAULT_SPIKE_BUFFER) -> int:
    """Bytes placement may still promise on this GPU, contexts included (never
    negative). A job using more than it booked (a burstable job bursting) counts at what
    it uses."""
    booked = sum(u.booked for u in gpu.managed)
    return max(gpu.total - gpu.reserve - booked - foreign_charge(gpu.foreign_peak, spike_buffer), 0)


def room_for_budget(gpu: GpuState, room: int) -> int:
    """The largest budget a job could get from ``room`` of headroom on this GPU: what its
    context leaves."""
    return max(room - gpu.context, 0)


# --- from a Snapshot ---------------------------------------------------------------------


def foreign_memory(view: GpuView, managed_pids: Set[int]) -> int:
    """Bytes on this GPU that no managed job accounts for: foreign processes plus memory
    no process accounts for (leaked memory is not free). When the driver withholds a
    process's figure, everything not shown as managed counts, to stay on the safe side."""
    unaccounted = view.unaccounted
    if unaccounted is None:
        mine = sum(p.memory or 0 for p in view.processes if p.pid in managed_pids)
        return max(view.facts.memory_used - view.facts.driver_baseline - mine, 0)
    foreign = sum(p.memory or 0 for p in view.processes if p.pid not in managed_pids)
    return foreign + max(unaccounted, 0)


def foreign_parts(view: GpuView, managed_pids: Set[int]) -> tuple[int, int | None]:
    """``foreign_memory`` in its two parts: foreign processes' bytes, and memory no
    process accounts for (None when the driver withholds figures: then the first part
    is all that is not shown as managed)."""
    unaccounted = view.unaccounted
    if unaccounted is None:
        return foreign_memory(view, managed_pids), None
    return foreign_memory(view, managed_pids) - max(unaccounted, 0), max(unaccounted, 0)


def foreign_usage(snapshot: Snapshot, managed_pids: Set[int]) -> dict[str, int]:
    """Foreign bytes now, per GPU uuid: the daemon folds these into the peaks it keeps."""
    return {v.facts.uuid: foreign_memory(v, managed_pids) for v in snapshot.gpus}


def gpu_states(
    snapshot: Snapshot,
    managed: Mapping[str, Sequence[ManagedUse]],
    managed_pids: Set[int],
    foreign_peaks: Mapping[str, int] | None = None,
    reserve: int = DEFAULT_RESERVE,
    *,
    contexts: Mapping[str, int] | None = None,
) -> list[GpuState]:
    """GPU states for placement. ``managed`` maps a GPU uuid to the reservations of
    reserved/running jobs; ``managed_pids`` are the pids of their process trees, so the
    rest is foreign; ``foreign_peaks`` are the per-uuid foreign figures the daemon
    keeps (its peaks and what persisted), used instead of this snapshot's where given;
    ``contexts`` the CUDA context allowance per uuid."""
    peaks = foreign_peaks or {}
    ctx = contexts or {}
    states = []
    for gpu, view, mig in _places(snapshot):
        f = view.facts
        states.append(
            GpuState(
                index=f.index,
                uuid=f.uuid,
                total=f.memory_total,
                reserve=reserve,
                numa_node=f.numa_node,
                nvlink_peers=f.nvlink_peers,
                compute_mode=f.compute_mode or "Default",
                managed=tuple(managed.get(f.uuid, ())),
                context=ctx.get(f.uuid, ctx.get(gpu.uuid, 0)),
                mig=mig,
                foreign_peak=peaks[f.uuid]
                if f.uuid in peaks
                else foreign_memory(view, managed_pids),
                foreign_processes=sum(1 for p in view.processes if p.pid not in managed_pids),
                foreign_users=frozenset(
                    p.user
                    for p in view.processes
                    if p.pid not in managed_pids and p.user and p.state == RUNNING
                ),
            )
        )
    return states


def _places(snapshot: Snapshot) -> list[tuple[GpuFacts, GpuView, str | None]]:
    """(GPU, place, MIG profile): each GPU is a place, except that a GPU in MIG mode is
    its instances, each with its own memory and the processes NVML lists on it."""
    out: list[tuple[GpuFacts, GpuView, str | None]] = []
    for view in snapshot.gpus:
        f = view.facts
        if not f.mig_instances:
            out.append((f, view, None))
        for m in f.mig_instances:
            out.append(
                (
                    f,
                    GpuView(
                        replace(mig_device(f, m), driver_baseline=0),
                        tuple(p for p in view.processes if p.gpu.mig_uuid == m.uuid),
                    ),
                    m.profile,
                )
            )
    return out
