"""Small builders for Snapshots made of plain facts, for tests of the pure core, and a
request field's value other than its default."""

from __future__ import annotations

from typing import Any

from gpuwarden.gpus.model import GpuFacts, GpuProcessFacts
from gpuwarden.jobs import request
from gpuwarden.observe.snapshot import GpuView, ProcessView, Snapshot, process_state
from gpuwarden.procs.model import Holder, ProcInfo

GiB = 1024**3


def gpu(index: int = 0, used: int = 0, total: int = 80 * GiB, **kw: Any) -> GpuFacts:
    return GpuFacts(
        index=index,
        uuid=f"GPU-{index}",
        name="Test GPU",
        memory_total=total,
        memory_used=used,
        memory_free=total - used,
        **kw,
    )


def info(pid: int, **kw: Any) -> ProcInfo:
    base: dict[str, Any] = dict(
        exists=True,
        start_time=1000.0 + pid,
        user="alice",
        uid=1000,
        command=f"python job{pid}.py",
        status="running",
        ppid=500,
        pgid=pid,
        group_leader_alive=True,
        parent_pgid=500,
    )
    base.update(kw)
    return ProcInfo(pid=pid, **base)


def proc(
    pid: int, gpu_index: int = 0, memory: int | None = GiB, sm: int | None = 0, **kw: Any
) -> ProcessView:
    i = info(pid, **kw)
    return ProcessView(
        GpuProcessFacts(pid=pid, gpu_index=gpu_index, memory=memory, sm_utilization=sm),
        i,
        process_state(i),
        10.0,
    )


def snapshot(
    gpus: list[tuple[GpuFacts, list[ProcessView]]],
    holders: list[Holder] = (),  # type: ignore[assignment]
    taken_at: float = 2000.0,
    observer: int = 99999,
) -> Snapshot:
    return Snapshot(
        taken_at=taken_at,
        backend="test",
        driver_version="1",
        gpus=tuple(GpuView(g, tuple(ps)) for g, ps in gpus),
        holders=tuple(holders),
        in_child_namespace=False,
        observer_pid=observer,
    )


def holder(pid: int, devices: tuple[str, ...], gpus: tuple[int, ...], **kw: Any) -> Holder:
    return Holder(
        pid=pid,
        devices=devices,
        gpu_indices=gpus,
        user=kw.get("user", "bob"),
        command=kw.get("command", "python nb.py"),
        start_time=kw.get("start", 5.0),
        uses_uvm=any(d.endswith("uvm") for d in devices),
    )


# The legal way from queued to each state (jobs/lifecycle.py), for tests that need a job
# in some state: (event, to) steps.
_PATH = {
    "queued": (),
    "held": (("held", "held"),),
    "reserved": (("placed", "reserved"),),
    "running": (("placed", "reserved"), ("started", "running")),
    "succeeded": (("placed", "reserved"), ("started", "running"), ("succeeded", "succeeded")),
    "failed": (("placed", "reserved"), ("started", "running"), ("failed", "failed")),
    "cancelled": (("cancelled", "cancelled"),),
    "infeasible": (("infeasible", "infeasible"),),
}


def move(store: Any, job_id: int, state: str, now: float, **fields: Any) -> Any:
    """Take a queued job to ``state`` by the events the daemon would record; ``fields``
    are set by the last one. Returns the job as committed."""
    job = store.get(job_id)
    at = "queued"
    for event, to in _PATH[state]:
        last = to == state
        job = store.transition(job_id, (at,), to, now=now, kind=event, **(fields if last else {}))
        at = to
    return job


def non_default(f: request.Field) -> Any:
    """A value of the request field ``f`` other than its default, as a request has it
    (a string with a control character in it, for the renderers to make visible)."""
    if f.kind == request.INTEGER:
        return f.hi
    if f.kind == request.BOOLEAN:
        return not f.default
    if f.kind == request.CHOICE:
        return next(c for c in f.choices if c != f.default)
    if f.kind == request.STRING:
        return "\x1b[31m a note ü" + "x" * max((f.min_length or 0) - 10, 0)
    if f.kind == request.IDS:
        return [f.lo or 0]
    if f.kind in (request.SIZE, request.DURATION):
        return 7
    raise AssertionError(f"{f.name}: add a value of kind {f.kind} here")
