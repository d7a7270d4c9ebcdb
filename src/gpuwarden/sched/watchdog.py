"""The watchdog, the third layer of memory enforcement: what to do about a running job
whose sampled GPU memory (NVML, its whole process tree) is past its limit. The first two
layers (the PyTorch cap, MPS) stop a job from allocating past its limit; this one catches
what they cannot see (non-PyTorch allocations, other frameworks, a cap turned off).

Per QoS class: a guaranteed job is only warned about (its room is reserved); a besteffort
job is killed; a burstable job is killed when someone is waiting for room, else warned.
A burstable job between its request and its ``--mem-limit`` is bursting, which is
allowed: that is noted once, never acted on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuwarden.jobs.request import BESTEFFORT, BURSTABLE, GUARANTEED
from gpuwarden.units import format_bytes

WARN, KILL, NOTE = "warn", "kill", "note"


@dataclass(frozen=True)
class OverLimit:
    """Decision about one job: ``action`` is "kill", "warn" or "note" (bursting)."""

    job_id: int
    action: str
    gpu: str  # the GPU where it is furthest over (as named in ``used``)
    used: int
    limit: int
    detail: str


def policy(qos: str) -> str:
    """The watchdog's policy for a class, in words (``show`` prints it)."""
    return {
        GUARANTEED: "warn over the limit",
        BESTEFFORT: "kill over the limit",
        BURSTABLE: "kill over the limit when another job needs the room, else warn",
    }.get(qos, "warn over the limit")


def check(
    job_id: int,
    qos: str,
    request: int | None,
    limit: int | None,
    used: Mapping[str, int],
    room_wanted: bool,
) -> OverLimit | None:
    """``request``: bytes reserved per GPU; ``limit``: bytes it may use per GPU (None:
    a whole GPU, nothing to check); ``used``: bytes it uses now, per GPU name;
    ``room_wanted``: a queued job is waiting for memory."""
    if limit is None or request is None or not used:
        return None
    gpu, most = max(used.items(), key=lambda kv: (kv[1], kv[0]))
    if most > limit:
        action = KILL if qos == BESTEFFORT or (qos == BURSTABLE and room_wanted) else WARN
        return OverLimit(
            job_id,
            action,
            gpu,
            most,
            limit,
            f"uses {format_bytes(most)} on GPU {gpu}, over its limit "
            f"{format_bytes(limit)} ({qos}: {policy(qos)})",
        )
    if qos == BURSTABLE and most > request:
        return OverLimit(
            job_id,
            NOTE,
            gpu,
            most,
            limit,
            f"bursting: uses {format_bytes(most)} on GPU {gpu}, over its "
            f"request {format_bytes(request)}, within its limit "
            f"{format_bytes(limit)}",
        )
    return None
