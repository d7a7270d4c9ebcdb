"""Placement: which GPUs one queued job gets, as a pure function of GPU states, and why
it gets none.

A Place never asks more than the headroom of any of its GPUs (docs/design.md,
invariant 1; the arithmetic is headroom.py's), and ``booking.apply`` re-checks it for
every Place it books. A job's budget is what its allocations may hold (what ``--mem``
means); the context its process creates on the GPU is booked beside it
(``GpuState.context``), so a job that allocates exactly its budget fits where it was
placed. The fit check lives here and the queue order in queue.py, apart, so QoS and
preemption can replace either one without touching the other; the reasons a job
waits or can never run stay with the fit check, whose per-GPU verdicts they explain."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Protocol

from gpuwarden.sched.headroom import DEFAULT_SPIKE_BUFFER, capacity, headroom, room_for_budget
from gpuwarden.sched.model import GpuState, Place, QueuedJob
from gpuwarden.units import format_bytes

PROHIBITED = "Prohibited"
# One context per GPU (Exclusive_Thread is NVML's deprecated form of the same).
_SOLO_MODES = frozenset({"Exclusive_Process", "Exclusive_Thread"})
# Past this many candidate sets, pick per NUMA node greedily instead of enumerating.
_MAX_SETS = 256


# --- topology ----------------------------------------------------------------------------


class Linked(Protocol):
    """Anything placed on the topology: a GpuState here, a Candidate in select.py."""

    @property
    def index(self) -> int: ...
    @property
    def numa_node(self) -> int | None: ...
    @property
    def nvlink_peers(self) -> tuple[int, ...]: ...


def numa_nodes(gpus: Iterable[Linked]) -> int:
    """How many NUMA nodes a set spans (unknown counts as one node of its own)."""
    return len({g.numa_node for g in gpus})


def missing_links(gpus: Sequence[Linked]) -> int:
    """Pairs in the set that NVLink does not join (either side listing the other counts)."""
    return sum(
        1
        for a, b in itertools.combinations(gpus, 2)
        if b.index not in a.nvlink_peers and a.index not in b.nvlink_peers
    )


def preference(
    gpus: Sequence[Linked],
    users: Iterable[str],
    me: str | None,
) -> tuple[int, int, int]:
    """What placement and ``select`` both prefer before memory, smallest first: one NUMA
    node, NVLink peers, then GPUs without other users' processes (then the fewest other
    users): a job beside another user's server slows both, and the doctor warns of it.
    ``users``: whose work on the set counts (placement's ``gpu_users``); ``me``: who
    asks."""
    return numa_nodes(gpus), missing_links(gpus), len(set(users) - {me})


def gpu_users(gpu: GpuState, job: QueuedJob) -> frozenset[str]:
    """Whose work on the GPU ``preference`` keeps the job away from: the owners of its
    foreign processes (work gpuwarden neither budgets nor caps) and of its services (a
    server beside other work answers slower). For a batch job, other users' batch jobs
    do not count: they are budgeted and capped, and packing them side by side is what
    sharing by memory is for (keeping them apart costs makespan and waits: bench/
    RESULTS.md, section 6). A service keeps away from every other user's work."""
    return gpu.foreign_users | {
        u.user for u in gpu.managed if u.user and (u.service or job.service)
    }


# --- the fit check -----------------------------------------------------------------------


def _plural(n: int, word: str, suffix: str = "s") -> str:
    return f"{n} {word}{'' if n == 1 else suffix}"


def _ids(indices: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(indices))


def _candidates(job: QueuedJob, gpus: Sequence[GpuState]) -> list[GpuState] | None:
    """The GPUs the job may use; None when it names a GPU that is not here."""
    if job.gpu_ids is None:
        return list(gpus)
    wanted = set(job.gpu_ids)
    chosen = [g for g in gpus if g.index in wanted]
    return chosen if len(chosen) == len(wanted) else None


def _blocked(job: QueuedJob, gpu: GpuState, room: int) -> tuple[bool, str] | None:
    """Why this GPU cannot take the job now, or None when it can. The flag says the
    reason is only memory (more may free up on this GPU), for the wait reason."""
    if gpu.drained is not None:  # running jobs finish there; nothing new starts
        return False, "drained" + (f" ({gpu.drained})" if gpu.drained else "")
    if gpu.compute_mode == PROHIBITED:
        return False, "compute mode Prohibited"
    if job.mig is not None and gpu.mig != job.mig:
        return False, f"not a {job.mig} MIG instance"
    if job.mps and gpu.mig is not None:
        return False, "a MIG instance (no MPS server there)"
    if gpu.mig is not None and job.count > 1:
        return False, f"MIG instance {gpu.mig} (CUDA gives a process one)"
    busy = bool(gpu.managed) or gpu.foreign_processes > 0
    if gpu.compute_mode in _SOLO_MODES and busy:
        return False, f"{gpu.compute_mode} and in use"
    for use in gpu.managed:
        if use.exclusive:
            return False, f"held alone by job {use.job_id}"
    if job.alone and busy:
        bits = []
        if gpu.managed:
            bits.append(_plural(len(gpu.managed), "job"))
        if gpu.foreign_processes:
            bits.append(_plural(gpu.foreign_processes, "foreign process", "es"))
        return False, "in use by " + " and ".join(bits)
    if job.cpus and gpu.free_cpus is not None and len(gpu.free_cpus) < _cores_each(job):
        return False, f"{len(gpu.free_cpus)} free CPU core(s) near it"
    budget_room = room_for_budget(gpu, room)
    if job.mem is None:
        if budget_room <= 0:
            return True, f"no headroom ({format_bytes(gpu.foreign_peak)} foreign/leaked)"
        return None
    if room < job.mem + gpu.context:  # the job's context is booked beside its budget
        return True, f"{format_bytes(budget_room)} free"
    if (
        job.wait_for_ceiling
        and job.mem_ceiling is not None
        and budget_room < job.mem_ceiling
        and gpu.managed
    ):
        return True, (
            f"{format_bytes(budget_room)} free; waiting a while for up to "
            f"{format_bytes(job.mem_ceiling)} as jobs here end"
        )
    return None


def _cores_each(job: QueuedJob) -> int:
    """Cores each of the job's GPUs must have free near it (its --cpus, spread)."""
    return -(-(job.cpus or 0) // max(job.count, 1))


def pick_cores(job: QueuedJob, chosen: Sequence[GpuState]) -> tuple[int, ...] | None:
    """The job's --cpus cores: the lowest free ones near its GPUs, as evenly from each GPU's
    node as they allow. None when there are not enough (or the CPUs are unknown)."""
    if not job.cpus:
        return ()
    if any(g.free_cpus is None for g in chosen):
        return None
    pools = [sorted(g.free_cpus or ()) for g in chosen]
    picked: list[int] = []
    while len(picked) < job.cpus and any(pools):
        for pool in pools:
            while pool and pool[0] in picked:
                pool.pop(0)
            if pool and len(picked) < job.cpus:
                picked.append(pool.pop(0))
    return tuple(sorted(picked)) if len(picked) == job.cpus else None


def _set_key(
    job: QueuedJob,
    chosen: Sequence[tuple[GpuState, int]],
) -> tuple[int, int, int, int, tuple[int, ...]]:
    """``preference`` first (one NUMA node, NVLink peers, no other users), then best fit
    (least headroom left over, which packs jobs and keeps roomy GPUs for big ones);
    whole-GPU jobs take the set that gives the biggest budget, jobs with a ceiling the
    set that gives most up to it."""
    gpus = [g for g, _ in chosen]
    rooms = [room for _, room in chosen]
    if job.mem is None:
        fit = -min(rooms)
    elif job.mem_ceiling is not None:
        fit = -min(job.mem_ceiling, *rooms)
    else:
        fit = sum(room - job.mem for _, room in chosen)
    users = frozenset().union(*(gpu_users(g, job) for g in gpus))
    return (*preference(gpus, users, job.user), fit, tuple(sorted(g.index for g in gpus)))


def _gpu_key(job: QueuedJob, pair: tuple[GpuState, int]) -> tuple[int, int, int, int, int]:
    gpu, room = pair
    first = preference([gpu], gpu_users(gpu, job), job.user)
    if job.mem is None:
        return (*first, -room, gpu.index)
    if job.mem_ceiling is not None:  # the most it can be given, then best fit
        return (*first, -min(room, job.mem_ceiling), gpu.index)
    return (*first, room - job.mem, gpu.index)


def _budget(job: QueuedJob, rooms: Sequence[int]) -> int:
    """The budget a job gets on GPUs whose budget rooms (each ≥ its request) are
    ``rooms``: its request; what they all have for a whole-GPU job. A job with a
    ceiling (an OOM retry that crept into its cap) gets its request here too: the
    room up to its ceiling that no job of the pass takes comes after the pass
    (``queue.plan``)."""
    if job.mem is None:
        return min(rooms)
    return job.mem


def _best_set(job: QueuedJob, ok: list[tuple[GpuState, int]]) -> list[tuple[GpuState, int]]:
    n = job.count
    if n == 1:
        return [min(ok, key=lambda p: _gpu_key(job, p))]
    if math.comb(len(ok), n) <= _MAX_SETS:
        options: list[Sequence[tuple[GpuState, int]]] = list(itertools.combinations(ok, n))
    else:  # too many to try: the best fitting few of each NUMA node, and overall
        ranked = sorted(ok, key=lambda p: _gpu_key(job, p))
        nodes: dict[int | None, list[tuple[GpuState, int]]] = {}
        for p in ranked:
            nodes.setdefault(p[0].numa_node, []).append(p)
        options = [ranked[:n], *(g[:n] for g in nodes.values() if len(g) >= n)]
    best, best_key = options[0], _set_key(job, options[0])
    for opt in options[1:]:
        key = _set_key(job, opt)
        if key < best_key:
            best, best_key = opt, key
    return list(best)


def _preferred(
    job: QueuedJob,
    ok: list[tuple[GpuState, int]],
) -> list[tuple[GpuState, int]] | None:
    """The GPUs a restarted service ran on, when it fits on all of them again: it restarts
    in place (its neighbours and its users find it where it was); else None."""
    if job.prefer is None or len(job.prefer) != job.count:
        return None
    by_index = {g.index: (g, room) for g, room in ok}
    if not all(i in by_index for i in job.prefer):
        return None
    return [by_index[i] for i in job.prefer]


def fits(
    job: QueuedJob, gpus: Sequence[GpuState], spike_buffer: float = DEFAULT_SPIKE_BUFFER
) -> Place | None:
    """Where the job fits now, or None. Best fit on headroom (a job with a ceiling takes
    the GPUs that give it most, up to its ceiling); whole-GPU (``mem`` None) and
    exclusive jobs only on GPUs with no managed job and no foreign process; sets of
    ``count`` GPUs prefer one NUMA node and NVLink peers before best fit."""
    if job.count < 1 or (job.mem is not None and job.mem < 0):
        return None
    cands = _candidates(job, gpus)
    if cands is None:
        return None
    ok = []
    for gpu in cands:
        room = headroom(gpu, spike_buffer)
        if _blocked(job, gpu, room) is None:
            ok.append((gpu, room_for_budget(gpu, room)))
    if len(ok) < job.count:
        return None
    chosen = _preferred(job, ok) or _best_set(job, ok)
    budget = _budget(job, [room for _, room in chosen])
    cores = pick_cores(job, [g for g, _ in chosen])
    if cores is None:
        return None
    chosen = sorted(chosen, key=lambda p: (p[0].index, p[0].uuid))
    # A GPU's MIG instances share its index: a Place on one names it by uuid too.
    mig = any(g.mig is not None for g, _ in chosen)
    return Place(
        job.id,
        tuple(g.index for g, _ in chosen),
        budget,
        cores,
        uuids=tuple(g.uuid for g, _ in chosen) if mig else (),
    )


# --- reasons -----------------------------------------------------------------------------


def infeasible_reason(job: QueuedJob, gpus: Sequence[GpuState]) -> str | None:
    """Why the job could never run here, even on empty GPUs; None when it could."""
    if job.count < 1:
        return f"asks for {job.count} GPUs; a job needs at least one"
    if job.mem is not None and job.mem < 0:
        return f"asks for a negative amount of memory ({job.mem} bytes)"
    here = {g.index for g in gpus}
    if not here:
        return "this machine has no GPUs"
    if job.gpu_ids is not None:
        unknown = set(job.gpu_ids) - here
        if unknown:
            return f"unknown GPU {_ids(unknown)}: this machine has GPU {_ids(here)}"
        if not job.gpu_ids:
            return "the list of allowed GPUs is empty"
    cands = _candidates(job, gpus) or []
    if job.mig is not None:
        have = sorted({g.mig for g in cands if g.mig is not None})
        cands = [g for g in cands if g.mig == job.mig]
        if not cands:
            return (
                f"no {job.mig} MIG instance here ("
                + (f"instances: {', '.join(have)}" if have else "no GPU in MIG mode has instances")
                + "; gpuwarden creates none: see `gpuwarden doctor`)"
            )
    if job.mps and cands and all(g.mig is not None for g in cands):
        return "an MPS job, but every GPU here is in MIG mode (gpuwarden runs no MPS there)"
    where = "this machine" if job.gpu_ids is None else f"GPUs {_ids(g.index for g in cands)}"
    usable = [g for g in cands if g.compute_mode != PROHIBITED]
    barred = [g.index for g in cands if g.compute_mode == PROHIBITED]
    if not usable:
        return f"GPU {_ids(barred)}: compute mode Prohibited (no process may use it)"
    if job.count > len(usable):
        why = f" (GPU {_ids(barred)}: Prohibited)" if barred else ""
        return f"needs {_plural(job.count, 'GPU')} but only {len(usable)} usable on {where}{why}"
    if job.cpus:
        known = [g for g in usable if g.local_cpus is not None]
        if known and max(len(g.local_cpus or ()) for g in known) * job.count < job.cpus:
            most = max(len(g.local_cpus or ()) for g in known)
            return (
                f"asks for {job.cpus} CPU cores, but at most {most} are near each GPU "
                f"({most * job.count} for {_plural(job.count, 'GPU')})"
            )
    need = 1 if job.mem is None else job.mem
    big = [g for g in usable if capacity(g) >= need]
    if len(big) >= job.count:
        return None
    largest = max(usable, key=capacity)
    if not big and job.mem is None:
        return (
            f"no GPU on {where} has memory left after its reserve ({format_bytes(largest.reserve)})"
        )
    if not big:
        return (
            f"{format_bytes(need)} per GPU is more than {where} can give (largest: "
            f"{format_bytes(capacity(largest))} = {format_bytes(largest.total)} total − "
            f"{format_bytes(largest.reserve)} reserve"
            + (f" − {format_bytes(largest.context)} CUDA context)" if largest.context else ")")
        )
    what = "any memory" if job.mem is None else format_bytes(job.mem)
    return (
        f"only {_plural(len(big), 'GPU')} on {where} can give {what} "
        f"(GPU {_ids(g.index for g in big)}); {job.count} can never fit"
    )


def wait_reason(
    job: QueuedJob, gpus: Sequence[GpuState], spike_buffer: float = DEFAULT_SPIKE_BUFFER
) -> str:
    """Why a feasible job does not fit now, with numbers, for ``show`` and ``ps``."""
    n = job.count
    each = "one GPU" if n == 1 else f"each of {n} GPUs"
    if job.mem is None:
        want = "an idle GPU" if n == 1 else f"{n} idle GPUs"
    elif job.exclusive:
        want = f"{format_bytes(job.mem)} free on {each}, with no other job or process"
    else:
        want = f"{format_bytes(job.mem)} free on {each}"
    ok: list[int] = []
    short: list[tuple[int, int]] = []  # (room, index) of GPUs short of memory only
    others: dict[str, list[int]] = {}
    for gpu in _candidates(job, gpus) or []:
        room = headroom(gpu, spike_buffer)
        why = _blocked(job, gpu, room)
        if why is None:
            ok.append(gpu.index)
        elif why[0] and job.mem is not None:
            short.append((room_for_budget(gpu, room), gpu.index))
        else:
            others.setdefault(why[1], []).append(gpu.index)
    parts = []
    if ok:
        parts.append(f"only GPU {_ids(ok)} {'qualifies' if len(ok) == 1 else 'qualify'}")
    if short:
        room, index = max(short, key=lambda s: (s[0], -s[1]))
        parts.append(f"{'next ' if ok else ''}best has {format_bytes(room)} (GPU {index})")
    parts.extend(f"GPU {_ids(ix)}: {why}" for why, ix in others.items())
    return f"waiting for {want}; " + "; ".join(parts) if parts else f"waiting for {want}"
