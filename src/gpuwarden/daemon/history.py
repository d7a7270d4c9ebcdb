"""GPU memory over time, from the daemon's own passes: who held what on each GPU (each
managed job, every other user, memory nobody accounts for), sampled every
``history_interval`` and kept in SQLite for ``history_retention``. The web page draws its
charts from these, so it needs no Prometheus.

Pure functions: ``sample_gpus`` turns one pass's snapshot into samples; ``series``
shapes stored samples into stacked chart series (downsampled to a point budget, each
bucket keeping its highest values, so a short spike stays visible); ``leak_periods``
finds the spans where leaked memory stood above a threshold."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwarden.observe.snapshot import Snapshot

LEAK_THRESHOLD = 64 << 20  # leaked memory below this is noise (driver bookkeeping)


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment; bytes."""

    ts: int  # unix seconds
    uuid: str
    index: int
    total: int
    used: int
    leaked: int
    jobs: dict[int, int] = field(default_factory=dict)  # managed job id -> bytes
    users: dict[str, int] = field(default_factory=dict)  # others' processes by user

    def parts(self) -> dict[str, Any]:
        return {"j": {str(k): v for k, v in self.jobs.items()}, "u": dict(self.users)}

    @classmethod
    def from_row(
        cls,
        ts: int,
        uuid: str,
        index: int,
        total: int,
        used: int,
        leaked: int,
        parts: Mapping[str, Any],
    ) -> GpuSample:
        return cls(
            ts=ts,
            uuid=uuid,
            index=index,
            total=total,
            used=used,
            leaked=leaked,
            jobs={int(k): int(v) for k, v in parts.get("j", {}).items()},
            users={str(k): int(v) for k, v in parts.get("u", {}).items()},
        )


def sample_gpus(
    snap: Snapshot,
    job_use: Mapping[int, Mapping[str, int]],
    managed_pids: set[int],
    now: float,
    leftovers: Mapping[int, int] | None = None,
) -> list[GpuSample]:
    """Samples of every GPU: ``job_use`` is {job id: {GPU uuid: bytes its tree uses}}
    (what the pass computed). ``leftovers`` maps pids an ended attempt left behind to
    their job: their memory stays the job's, so a leak shows on the job that made it.
    Other processes count for their user, except dead, garbage and zombie pids, whose
    memory nobody will give back: that is leaked, with what no process accounts for."""
    from gpuwarden.observe.snapshot import DEAD, GARBAGE, OTHER_NAMESPACE, ZOMBIE

    leftovers = leftovers or {}
    out = []
    for view in snap.gpus:
        uuid = view.facts.uuid
        jobs = {jid: per[uuid] for jid, per in job_use.items() if per.get(uuid)}
        users: dict[str, int] = {}
        leaked = max(0, view.unaccounted or 0)
        for p in view.processes:
            if not p.memory or (p.pid in managed_pids and p.pid not in leftovers):
                continue
            if p.pid in leftovers:
                jid = leftovers[p.pid]
                jobs[jid] = jobs.get(jid, 0) + p.memory
            elif p.state in (DEAD, GARBAGE, ZOMBIE):
                leaked += p.memory
            else:
                who = p.user or ("(container)" if p.state == OTHER_NAMESPACE else "(unknown)")
                users[who] = users.get(who, 0) + p.memory
        out.append(
            GpuSample(
                ts=int(now),
                uuid=uuid,
                index=view.facts.index,
                total=view.facts.memory_total,
                used=view.facts.memory_used,
                leaked=leaked,
                jobs=jobs,
                users=users,
            )
        )
    return out


@dataclass(frozen=True)
class Series:
    """One GPU's chart: timestamps and, per stacked layer, values aligned with them."""

    uuid: str
    index: int
    total: int
    t: list[int]
    used: list[int]
    leaked: list[int]
    layers: dict[str, list[int]]  # "job 12" / "user bob" -> bytes per point


def _label_job(job_id: int, owners: Mapping[int, str]) -> str:
    owner = owners.get(job_id)
    return f"job {job_id}" + (f" ({owner})" if owner else "")


def series(
    samples: Iterable[GpuSample], owners: Mapping[int, str], *, by: str = "job", points: int = 360
) -> list[Series]:
    """Chart series per GPU, oldest first. ``by="job"`` stacks each managed job and each
    other user; ``by="user"`` folds jobs into their owners. At most ``points`` points:
    samples are grouped into buckets and each layer keeps its bucket's highest value."""
    if by not in ("job", "user"):
        raise ValueError("by must be 'job' or 'user'")
    per_gpu: dict[str, list[GpuSample]] = {}
    for s in samples:
        per_gpu.setdefault(s.uuid, []).append(s)
    out = []
    for uuid, rows in sorted(per_gpu.items(), key=lambda kv: kv[1][0].index):
        rows.sort(key=lambda s: s.ts)
        size = max(1, -(-len(rows) // max(1, points)))
        buckets = [rows[i : i + size] for i in range(0, len(rows), size)]
        names: list[str] = []
        values: list[dict[str, int]] = []
        for bucket in buckets:
            point: dict[str, int] = {}
            for s in bucket:
                layer: dict[str, int] = {}
                for jid, b in s.jobs.items():
                    name = (
                        _label_job(jid, owners) if by == "job" else f"user {owners.get(jid, '?')}"
                    )
                    layer[name] = layer.get(name, 0) + b
                for user, b in s.users.items():
                    name = f"user {user}"
                    layer[name] = layer.get(name, 0) + b
                for name, b in layer.items():
                    point[name] = max(point.get(name, 0), b)
            for name in point:
                if name not in names:
                    names.append(name)
            values.append(point)
        out.append(
            Series(
                uuid=uuid,
                index=rows[0].index,
                total=rows[-1].total,
                t=[b[-1].ts for b in buckets],
                used=[max(s.used for s in b) for b in buckets],
                leaked=[max(s.leaked for s in b) for b in buckets],
                layers={n: [v.get(n, 0) for v in values] for n in names},
            )
        )
    return out


def leak_periods(
    t: Sequence[int], leaked: Sequence[int], *, threshold: int = LEAK_THRESHOLD
) -> list[tuple[int, int]]:
    """[start, end] spans where leaked memory stood at or above ``threshold``."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for ts, value in zip(t, leaked, strict=True):
        if value >= threshold and start is None:
            start = ts
        elif value < threshold and start is not None:
            spans.append((start, ts))
            start = None
    if start is not None and t:
        spans.append((start, t[-1]))
    return spans


def job_timeline(samples: Iterable[GpuSample], job_id: int) -> dict[str, list[int]]:
    """The job's memory over time on its fullest GPU (budgets are per GPU):
    {"t": [...], "used": [...]}."""
    per_ts: dict[int, int] = {}
    for s in samples:
        if job_id in s.jobs:
            per_ts[s.ts] = max(per_ts.get(s.ts, 0), s.jobs[job_id])
    ts = sorted(per_ts)
    return {"t": ts, "used": [per_ts[x] for x in ts]}
