"""Leak classification: memory nobody accounts for, holders nobody lists, pids nobody
owns. A pure function of one or more snapshots, each finding with its evidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from gpuwarden.observe.snapshot import (
    DEAD,
    GARBAGE,
    ORPHAN,
    OTHER_NAMESPACE,
    ZOMBIE,
    ProcessView,
    Snapshot,
)
from gpuwarden.units import MiB, format_bytes

KINDS = (
    "unaccounted",
    "hidden_holder",
    "monitor",
    "other_namespace",
    "dead_pid",
    "garbage_pid",
    "zombie",
    "orphan",
)
DEFAULT_THRESHOLD = 64 * MiB
_STATE_KIND = {
    DEAD: "dead_pid",
    GARBAGE: "garbage_pid",
    OTHER_NAMESPACE: "other_namespace",
    ZOMBIE: "zombie",
    ORPHAN: "orphan",
}


@dataclass(frozen=True)
class Leak:
    gpu: int | None
    kind: str
    memory: int | None
    pid: int | None
    user: str | None
    evidence: str
    command: str | None = None
    start_time: float | None = None  # with pid, identifies the process to reap
    parent: int | None = None
    mig: str | None = None  # the MIG instance whose process list names it

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @property
    def key(self) -> tuple[int | None, str, int | None]:
        return (self.gpu, self.kind, self.pid)


def _process_leak(p: ProcessView, gpu: int) -> Leak | None:
    kind = _STATE_KIND.get(p.state)
    if kind is None:
        return None
    mem = format_bytes(p.memory)
    mig = p.gpu.mig_uuid  # on a GPU in MIG mode: the instance that lists it
    where = f"GPU {gpu}" + (f" (MIG instance {mig})" if mig else "")
    if kind == "dead_pid":
        ev = (
            f"the driver charges {mem} on {where} to pid {p.pid}, but no such process "
            "exists: it is gone and its memory was not freed"
        )
    elif kind == "garbage_pid":
        ev = (
            f"the driver reports pid {p.pid} on {where} with {mem}; no kernel issues that "
            "pid, so the driver and NVML library disagree on a struct version"
        )
    elif kind == "other_namespace":
        where = (
            f"container {p.container}"
            if p.container
            else p.info.namespace_hint or "another PID namespace"
        )
        ev = (
            f"the driver lists pid {p.pid} on {where} with {mem}, but this /proc has no "
            f"such pid: it belongs to {where}"
        )
    elif kind == "zombie":
        ev = (
            f"pid {p.pid} ({p.describe()}) is defunct and still holds {mem} on {where}; "
            f"its parent pid {p.info.ppid} has not reaped it"
        )
    else:
        to = "init" if p.info.ppid == 1 else f"pid {p.info.ppid}"
        ev = (
            f"pid {p.pid} ({p.describe()}) was re-parented to {to} after the leader of its "
            f"process group (pgid {p.info.pgid}) died, and still holds {mem} on {where}"
        )
    return Leak(
        gpu=gpu,
        kind=kind,
        memory=p.memory,
        pid=p.pid,
        user=p.user,
        evidence=ev,
        command=p.command,
        start_time=p.info.start_time,
        parent=p.info.ppid,
        mig=mig,
    )


def _leaks_of(snap: Snapshot) -> list[Leak]:
    out: list[Leak] = []
    holding: dict[int, list[int]] = {}  # GPU -> hidden holders that may keep its memory
    for h in snap.hidden_holders:
        if not h.is_monitor:
            for idx in h.gpu_indices:
                holding.setdefault(idx, []).append(h.pid)
    for g in snap.gpus:
        for p in g.processes:
            if p.state not in _STATE_KIND:  # running: most processes, most of the time
                continue
            leak = _process_leak(p, g.index)
            if leak and leak.kind == "dead_pid" and g.index in holding:
                pids = ", ".join(map(str, sorted(holding[g.index])))
                leak = replace(
                    leak,
                    evidence=f"{leak.evidence}; pid {pids} still holds this "
                    "GPU's device files (a worker forked from it?) and can keep "
                    "that memory alive: reap it first",
                )
            if leak:
                out.append(leak)
    for h in snap.hidden_holders:
        who = ", ".join(x for x in (h.command or "?", f"user {h.user}" if h.user else "") if x)
        if h.is_monitor:
            what = (
                f"holds only {', '.join(h.devices)}"
                if not h.gpu_indices
                else f"holds {', '.join(h.devices)} without mapping them (NVML only, no "
                "CUDA context)"
            )
            out.append(
                Leak(
                    gpu=None,
                    kind="monitor",
                    memory=None,
                    pid=h.pid,
                    user=h.user,
                    evidence=f"pid {h.pid} ({who}) {what}: a monitoring tool, harmless",
                    command=h.command,
                    start_time=h.start_time,
                )
            )
            continue
        for idx in h.gpu_indices:
            ctx = " with GPU memory mapped (a CUDA context)" if h.device_mapped else ""
            out.append(
                Leak(
                    gpu=idx,
                    kind="hidden_holder",
                    memory=None,
                    pid=h.pid,
                    user=h.user,
                    evidence=f"pid {h.pid} ({who}) holds {', '.join(h.devices)} "
                    f"open{ctx}, but the driver lists it on no GPU",
                    command=h.command,
                    start_time=h.start_time,
                )
            )
    return out


def _unaccounted(snaps: Sequence[Snapshot], threshold: int) -> list[Leak]:
    last = snaps[-1]
    out: list[Leak] = []
    for g in last.gpus:
        seen: list[int] = []
        for s in snaps:
            gv = s.gpu(g.index)
            u = None if gv is None else gv.unaccounted
            if u is None or u < threshold:
                break
            seen.append(u)
        else:
            if not seen:
                continue
            amount = min(seen)
            span = last.taken_at - snaps[0].taken_at
            pm = g.process_memory or 0
            ev = (
                f"GPU {g.index} has {format_bytes(amount)} in use that no process accounts "
                f"for (used {format_bytes(g.facts.memory_used)}, processes "
                f"{format_bytes(pm)}, driver baseline {format_bytes(g.facts.driver_baseline)})"
                f", in {len(snaps)} of {len(snaps)} samples over {span:.1f}s"
            )
            out.append(
                Leak(
                    gpu=g.index, kind="unaccounted", memory=amount, pid=None, user=None, evidence=ev
                )
            )
    return out


def find_leaks(snaps: Sequence[Snapshot], threshold: int = DEFAULT_THRESHOLD) -> list[Leak]:
    """Leaks present in every one of ``snaps`` (oldest first), so one blip — a process
    exiting between two reads — is not reported. Memory figures are from the newest."""
    if not snaps:
        return []
    per_snap = [{leak.key: leak for leak in _leaks_of(s)} for s in snaps]
    common = set(per_snap[0])
    for keys in per_snap[1:]:
        common &= set(keys)
    latest = per_snap[-1]
    found = [latest[k] for k in common] + _unaccounted(snaps, threshold)
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(
        found, key=lambda lk: (lk.gpu if lk.gpu is not None else -1, order[lk.kind], lk.pid or 0)
    )
