"""The stable JSON schema of a snapshot (``status --json``); bytes and seconds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuwarden.observe.leaks import Leak
from gpuwarden.observe.snapshot import GpuView, ProcessView, Snapshot
from gpuwarden.procs.model import Holder

SCHEMA_VERSION = 1


def process_json(p: ProcessView) -> dict[str, Any]:
    return {
        "pid": p.pid,
        "user": p.user,
        "command": p.command,
        "memory": p.memory,
        "container": p.container,
        "state": p.state,
        "sm_utilization": p.gpu.sm_utilization,
        "elapsed": None if p.elapsed is None else round(p.elapsed, 3),
        "start_time": p.info.start_time,
        "kinds": list(p.gpu.kinds),
        "job": p.job,
        "mig": p.gpu.mig_uuid,
    }


def gpu_json(g: GpuView, processes: Sequence[ProcessView] | None = None) -> dict[str, Any]:
    f = g.facts
    return {
        "index": f.index,
        "uuid": f.uuid,
        "name": f.name,
        "memory_total": f.memory_total,
        "memory_used": f.memory_used,
        "memory_free": f.memory_free,
        "memory_reserved": f.memory_reserved,
        "utilization": f.utilization,
        "temperature": f.temperature,
        "power_watts": f.power_watts,
        "power_limit_watts": f.power_limit_watts,
        "compute_mode": f.compute_mode,
        "persistence_mode": f.persistence_mode,
        "mig_mode": f.mig_mode,
        "mps": f.mps,
        "numa_node": f.numa_node,
        "cpus": f.cpus,
        "pci_bus_id": f.pci_bus_id,
        "ecc_uncorrected": f.ecc_uncorrected,
        "retired_pages": f.retired_pages,
        "nvlink_peers": list(f.nvlink_peers),
        "mig_instances": [
            {
                "gi_id": m.gi_id,
                "ci_id": m.ci_id,
                "profile": m.profile,
                "uuid": m.uuid,
                "memory_total": m.memory_total,
                "memory_used": m.memory_used,
                "memory_free": m.memory_free,
                "processes": [p.pid for p in g.processes if p.gpu.mig_uuid == m.uuid],
            }
            for m in f.mig_instances
        ],
        "processes": [process_json(p) for p in (g.processes if processes is None else processes)],
    }


def holder_json(h: Holder) -> dict[str, Any]:
    return {
        "pid": h.pid,
        "user": h.user,
        "command": h.command,
        "devices": list(h.devices),
        "gpus": list(h.gpu_indices),
        "monitor": h.is_monitor,
    }


def snapshot_json(
    snap: Snapshot,
    leaks: Sequence[Leak],
    *,
    gpus: Sequence[int] = (),
    user: str | None = None,
    pid: int | None = None,
) -> dict[str, Any]:
    """Filters narrow GPUs (by index) and processes (by user or pid); totals stay whole."""
    out_gpus = []
    for g in snap.gpus:
        if gpus and g.index not in gpus:
            continue
        procs = [
            p
            for p in g.processes
            if (user is None or p.user == user) and (pid is None or p.pid == pid)
        ]
        out_gpus.append(gpu_json(g, procs))
    return {
        "schema": SCHEMA_VERSION,
        "backend": snap.backend,
        "driver_version": snap.driver_version,
        "taken_at": snap.taken_at,
        "gpus": out_gpus,
        "holders": [holder_json(h) for h in snap.holders],
        "leaks": [leak.to_json() for leak in leaks if not gpus or leak.gpu in gpus],
        "warnings": list(snap.warnings),
    }
