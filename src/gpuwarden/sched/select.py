"""Which GPUs a job should get: a pure ranking over a snapshot and the outstanding leases.

``choose_gpus`` returns a decision as a value, a ``Choice`` or a ``Rejection`` that says
for every GPU why it was passed over, so ``select`` and ``exec`` share one policy and it
can be tested without GPUs or processes. Its GPU preference is the scheduler's
(``placement.preference``): one placement engine."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuwarden.gpus.visible import mig_device
from gpuwarden.observe.snapshot import GpuView
from gpuwarden.sched.placement import preference
from gpuwarden.units import format_bytes

# Past this many candidate sets, pick per NUMA node greedily instead of enumerating.
_MAX_SETS = 20_000


@dataclass(frozen=True)
class Request:
    """What a job asks for: ``memory`` bytes, or a ``fraction`` of each GPU's total, on
    each of ``count`` GPUs."""

    memory: int | None = None
    fraction: float | None = None
    count: int = 1
    max_util: int | None = None
    same_numa: bool = False
    user: str | None = None  # who asks: their own processes are no other user's
    mig: str | None = None  # a MIG instance of this profile (e.g. "3g.40gb") is wanted

    def __post_init__(self) -> None:
        if (self.memory is None) == (self.fraction is None):
            raise ValueError("a request gives exactly one of memory and fraction")
        if self.count < 1:
            raise ValueError("count must be at least 1")

    def need(self, total: int) -> int:
        """Bytes this request needs on a GPU with ``total`` bytes."""
        if self.memory is not None:
            return self.memory
        assert self.fraction is not None
        return int(total * self.fraction)

    def describe(self) -> str:
        if self.memory is not None:
            return format_bytes(self.memory)
        assert self.fraction is not None
        return f"{self.fraction * 100:g}% of each GPU's memory"


@dataclass(frozen=True)
class Candidate:
    """One GPU as the policy saw it; ``reason`` is None when it qualifies."""

    index: int
    uuid: str
    numa_node: int | None
    total: int
    need: int
    free: int  # effective: driver's free minus outstanding leases, never negative
    leased: int
    utilization: int | None
    users: frozenset[str]
    nvlink_peers: tuple[int, ...]
    reason: str | None
    impossible: bool = False  # can never fit this request (total too small)
    mig: str | None = None  # a MIG instance's profile (uuid is then its MIG- UUID)
    gi_id: int | None = None  # its GPU instance id

    @property
    def qualifies(self) -> bool:
        return self.reason is None

    @property
    def label(self) -> str:
        """``GPU 0``, or ``GPU 0/2`` for GPU 0's GPU instance 2."""
        return f"GPU {self.index}" + ("" if self.gi_id is None else f"/{self.gi_id}")


@dataclass(frozen=True)
class Choice:
    gpus: tuple[Candidate, ...]  # in index order
    considered: tuple[Candidate, ...]

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(c.index for c in self.gpus)

    def cuda_visible_devices(self, *, uuid: bool = False) -> str:
        # CUDA names a MIG instance by its MIG- UUID only
        return ",".join(c.uuid if uuid or c.mig else str(c.index) for c in self.gpus)


@dataclass(frozen=True)
class Rejection:
    """Nothing fits. ``impossible`` means it never will on this machine (a usage error),
    as opposed to not right now."""

    reason: str
    considered: tuple[Candidate, ...]
    impossible: bool = False


def effective_free(free: int, leased: int) -> int:
    return max(free - leased, 0)


def places(gpus: Sequence[GpuView]) -> list[tuple[GpuView, str | None, int | None]]:
    """Where a job can run: each GPU, except that a GPU in MIG mode is its instances,
    each a device of its own (view, profile, GPU instance id)."""
    out: list[tuple[GpuView, str | None, int | None]] = []
    for g in sorted(gpus, key=lambda g: g.index):
        if not g.facts.mig_instances:
            out.append((g, None, None))
        for m in g.facts.mig_instances:
            view = GpuView(
                mig_device(g.facts, m), tuple(p for p in g.processes if p.gpu.mig_uuid == m.uuid)
            )
            out.append((view, m.profile, m.gi_id))
    return out


def assess(
    gpu: GpuView,
    request: Request,
    leased: int = 0,
    mig: str | None = None,
    gi_id: int | None = None,
) -> Candidate:
    """Judge one GPU (or, with ``mig``, one MIG instance of that profile) against the
    request, with ``leased`` bytes promised but not yet visible to the driver."""
    f = gpu.facts
    need = request.need(f.memory_total)
    free = effective_free(f.memory_free, leased)
    reason: str | None = None
    impossible = False
    if request.mig is not None and mig != request.mig:
        reason = f"not a {request.mig} MIG instance"
        impossible = True
    elif need > f.memory_total:
        reason = f"{format_bytes(f.memory_total)} total < {format_bytes(need)}"
        impossible = True
    elif mig is not None and request.count > 1:
        reason = "CUDA gives a process one MIG instance"
        impossible = True
    elif f.mig_mode and mig is None:
        reason = "MIG enabled, no instance"
    elif f.compute_mode == "Prohibited":
        reason = "compute mode Prohibited"
    elif f.compute_mode == "Exclusive_Process" and (gpu.processes or leased > 0):
        reason = "Exclusive_Process and in use"
    elif (
        request.max_util is not None
        and f.utilization is not None
        and f.utilization > request.max_util
    ):
        reason = f"util {f.utilization}% > {request.max_util}%"
    elif free < need:
        held = f" ({format_bytes(leased)} leased)" if leased else ""
        reason = f"{format_bytes(free)} free{held} < {format_bytes(need)}"
    return Candidate(
        index=f.index,
        uuid=f.uuid,
        numa_node=f.numa_node,
        total=f.memory_total,
        need=need,
        free=free,
        leased=leased,
        utilization=f.utilization,
        users=gpu.users,
        nvlink_peers=f.nvlink_peers,
        reason=reason,
        impossible=impossible,
        mig=mig,
        gi_id=gi_id,
    )


def rank_key(c: Candidate, me: str | None = None) -> tuple[int, int, int, int, int, int]:
    """Placement's ``preference`` (no other users' processes first, then fewest), then
    most effective free memory, then fewest distinct users, then lower index."""
    return (*preference([c], c.users, me), -c.free, len(c.users), c.index)


def set_key(
    gpus: Sequence[Candidate],
    me: str | None = None,
) -> tuple[int, int, int, int, int, tuple[int, ...]]:
    """Placement's ``preference`` (fewer NUMA nodes, fewer pairs without NVLink, no other
    users' processes, then the fewest), then the ranking applied to the set: its
    smallest free memory (a set is as roomy as its tightest GPU), its distinct users,
    its indices."""
    users: frozenset[str] = frozenset().union(*(c.users for c in gpus))
    return (
        *preference(gpus, users, me),
        -min(c.free for c in gpus),
        len(users),
        tuple(sorted(c.index for c in gpus)),
    )


def _by_node(cands: Iterable[Candidate]) -> dict[int | None, list[Candidate]]:
    groups: dict[int | None, list[Candidate]] = {}
    for c in cands:
        groups.setdefault(c.numa_node, []).append(c)
    return groups


def _best_set(
    qualified: list[Candidate], count: int, same_numa: bool, me: str | None = None
) -> list[Candidate] | None:
    pools = list(_by_node(qualified).values()) if same_numa else [qualified]
    pools = [p for p in pools if len(p) >= count]
    if not pools:
        return None
    best: list[Candidate] | None = None
    for pool in pools:
        ranked = sorted(pool, key=lambda c: rank_key(c, me))
        if math.comb(len(ranked), count) <= _MAX_SETS:
            options: Iterable[Sequence[Candidate]] = itertools.combinations(ranked, count)
        else:  # too many to try: the best few of each NUMA node, and the best overall
            options = [g[:count] for g in _by_node(ranked).values() if len(g) >= count]
            options = [*options, ranked[:count]]
        for opt in options:
            if best is None or set_key(opt, me) < set_key(best, me):
                best = list(opt)
    return best


def _brief(cands: Sequence[Candidate]) -> str:
    return "; ".join(f"{c.label}: {c.reason}" for c in cands if c.reason)


def choose_gpus(
    gpus: Sequence[GpuView], request: Request, leased: Mapping[str, int] | None = None
) -> Choice | Rejection:
    """Pick ``request.count`` GPUs, or say why none fit. ``leased`` maps a GPU uuid to
    the bytes promised to jobs that the driver does not show yet (see leases.py)."""
    leased = leased or {}
    considered = tuple(
        assess(g, request, leased.get(g.facts.uuid, 0), mig, gi) for g, mig, gi in places(gpus)
    )
    n = request.count
    if request.mig is not None and not any(c.mig == request.mig for c in considered):
        have = sorted({c.mig for c in considered if c.mig})
        return Rejection(
            f"no {request.mig} MIG instance here ("
            + (f"instances: {', '.join(have)}" if have else "no GPU in MIG mode has instances")
            + "; gpuwarden creates none: see `gpuwarden doctor`)",
            considered,
            impossible=True,
        )
    none = f"no {n} GPUs" if n > 1 else "no GPU"
    if n > len(considered):
        return Rejection(
            f"--count {n} but this machine has {len(considered)} GPU"
            f"{'s' if len(considered) != 1 else ''}",
            considered,
            impossible=True,
        )
    possible = [c for c in considered if not c.impossible]
    if len(possible) < n:
        largest = max((c.total for c in considered), default=0)
        if n == 1 or not possible:
            what = "GPU or MIG instance" if any(c.mig for c in considered) else "GPU"
            why = (
                f"{request.describe()} is more than any {what} here has "
                f"(largest: {format_bytes(largest)})"
            )
        else:
            why = (
                f"only {len(possible)} GPU{'s' if len(possible) != 1 else ''} here "
                f"{'are' if len(possible) != 1 else 'is'} big enough for "
                f"{request.describe()}; --count {n} can never fit"
            )
        return Rejection(why, considered, impossible=True)
    if request.same_numa and max(len(g) for g in _by_node(possible).values()) < n:
        return Rejection(
            f"no NUMA node has {n} GPUs big enough for {request.describe()}",
            considered,
            impossible=True,
        )
    qualified = [c for c in considered if c.qualifies]
    chosen = _best_set(qualified, n, request.same_numa, request.user)
    if chosen is None:
        util = f" at util ≤ {request.max_util}%" if request.max_util is not None else ""
        head = f"{none} with {request.describe()} free{util}"
        if len(qualified) >= n:  # enough GPUs, but not on one NUMA node
            nodes = ", ".join(
                f"node {'?' if k is None else k}: GPU {','.join(str(c.index) for c in v)}"
                for k, v in sorted(_by_node(qualified).items(), key=lambda kv: str(kv[0]))
            )
            return Rejection(f"{head} on one NUMA node (free: {nodes})", considered)
        rejected = _brief(considered)
        if qualified and n > 1:
            ok = ",".join(str(c.index) for c in qualified)
            rejected = f"only GPU {ok} fit{'s' if len(qualified) == 1 else ''}; {rejected}"
        return Rejection(f"{head} ({rejected})", considered)
    return Choice(tuple(sorted(chosen, key=lambda c: c.index)), considered)
