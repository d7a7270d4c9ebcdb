"""The Snapshot: every GPU with its processes joined to /proc facts, plus the device-file
holders. Built once, read by every view, rule and policy; never mutated."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

from gpuwarden.gpus.model import GpuFacts, GpuProcessFacts
from gpuwarden.procs.model import Holder, ProcInfo

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend

# What a GPU process can be, as seen from this machine's /proc.
RUNNING, DEAD, OTHER_NAMESPACE, GARBAGE, ZOMBIE, ORPHAN = (
    "running",
    "dead",
    "other_namespace",
    "garbage",
    "zombie",
    "orphan",
)


def process_state(info: ProcInfo) -> str:
    """Classify a pid the driver lists, from the /proc facts about it."""
    if info.exists and not info.garbage:
        if info.is_zombie:
            return ZOMBIE
        # is_orphan needs a dead group leader: most processes are spared its test.
        if info.group_leader_alive is False and info.is_orphan:
            return ORPHAN
        return RUNNING
    if info.garbage:
        return GARBAGE
    return OTHER_NAMESPACE if info.namespace_hint else DEAD


class ProcessView(NamedTuple):
    """A GPU process: what the driver says joined with what /proc says. A NamedTuple
    (immutable; ``_replace`` makes a changed copy), as ``GpuProcessFacts``: a snapshot
    makes one per GPU process."""

    gpu: GpuProcessFacts
    info: ProcInfo
    state: str
    elapsed: float | None
    daemon_jobs: Mapping[int, int] | None = None  # the daemon's pid -> job, when it answered

    @property
    def pid(self) -> int:
        return self.gpu.pid

    @property
    def memory(self) -> int | None:
        return self.gpu.memory

    @property
    def user(self) -> str | None:
        return self.info.user

    @property
    def command(self) -> str | None:
        return self.info.command

    @property
    def container(self) -> str | None:
        return self.info.container

    def describe(self) -> str:
        """Command, user and container, for evidence sentences."""
        bits = [self.command or "?"]
        if self.user:
            bits.append(f"user {self.user}")
        if self.container:
            bits.append(f"container {self.container}")
        return ", ".join(bits)

    @property
    def job(self) -> str | None:
        """The daemon job this process is part of: the daemon's word when it answered
        (it knows every user's job trees; an environment is readable only to its owner
        and root, and says what its process likes), else GPUWARDEN_JOB."""
        if self.daemon_jobs is not None:
            job = self.daemon_jobs.get(self.pid)
            return None if job is None else str(job)
        return (self.info.env or {}).get("GPUWARDEN_JOB")


@dataclass(frozen=True)
class GpuView:
    """A GPU and its processes. What is summed over the processes is computed once per
    view (``cached_property``: a view never changes), since the exporter, the leak rules
    and the placement policies each ask for it."""

    facts: GpuFacts
    processes: tuple[ProcessView, ...]

    @property
    def index(self) -> int:
        return self.facts.index

    @cached_property
    def users(self) -> frozenset[str]:
        return frozenset(p.user for p in self.processes if p.user and p.state == RUNNING)

    @cached_property
    def process_memory(self) -> int | None:
        """Sum of process memory; None when the driver withheld any process's figure."""
        total = 0
        for p in self.processes:
            memory = p.gpu.memory
            if memory is None:
                return None
            total += memory
        return total

    @cached_property
    def unaccounted(self) -> int | None:
        """Memory in use that no listed process accounts for (after the driver baseline)."""
        pm = self.process_memory
        if pm is None:
            return None
        return self.facts.memory_used - self.facts.driver_baseline - pm


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    backend: str
    driver_version: str | None
    gpus: tuple[GpuView, ...]
    holders: tuple[Holder, ...]
    in_child_namespace: bool
    observer_pid: int
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def gpu(self, index: int) -> GpuView | None:
        for g in self.gpus:
            if g.index == index:
                return g
        return None

    @cached_property
    def listed_pids(self) -> frozenset[int]:
        return frozenset(p.gpu.pid for g in self.gpus for p in g.processes)

    @cached_property
    def hidden_holders(self) -> tuple[Holder, ...]:
        """Holders of NVIDIA device files that the driver lists on no GPU."""
        listed = self.listed_pids
        return tuple(h for h in self.holders if h.pid not in listed)

    def process(self, pid: int) -> list[ProcessView]:
        return [p for g in self.gpus for p in g.processes if p.pid == pid]


def with_daemon_jobs(snap: Snapshot, jobs: Mapping[int, int] | None) -> Snapshot:
    """The snapshot with the daemon's pid -> job id of its running jobs (None: no daemon
    answered, and each process's environment says)."""
    if jobs is None:
        return snap
    return replace(
        snap,
        gpus=tuple(
            replace(g, processes=tuple(p._replace(daemon_jobs=jobs) for p in g.processes))
            for g in snap.gpus
        ),
    )


def take_snapshot(
    backend: Backend,
    *,
    holders: bool = True,
    detail: bool = True,
    now: float | None = None,
    known: Mapping[int, ProcInfo] | None = None,
    holder_pids: Collection[int] | None = None,
) -> Snapshot:
    """Query the backend once and join its facts with /proc. A re-check of an earlier
    snapshot's suspects (``observe/sampling.py``) passes ``known``, the /proc facts of
    the pids it need not read again, and ``holder_pids``, the only pids whose open
    device files it looks at; the driver's figures are always read anew."""
    taken_at = time.time() if now is None else now
    facts = backend.gpus()
    procs = backend.processes()
    source = backend.process_source()
    # Per GPU, (-memory, pid, n, view): sorted as tuples, largest first (n: never a tie).
    by_gpu: dict[int, list[tuple[int, int, int, ProcessView]]] = {g.index: [] for g in facts}
    info_of = source.info
    for n, p in enumerate(procs):
        on = by_gpu.get(p.gpu_index)
        if on is None:
            continue
        pid = p.pid
        info = known.get(pid) if known is not None else None
        if info is None:
            info = info_of(pid, detail=detail)
        start = info.start_time
        elapsed = None if start is None else max(taken_at - start, 0.0)
        on.append((-(p.memory or 0), pid, n, ProcessView(p, info, process_state(info), elapsed)))
    views = tuple(
        GpuView(g, tuple(row[3] for row in sorted(by_gpu[g.index])))
        for g in sorted(facts, key=lambda g: g.index)
    )
    me = os.getpid()
    held: tuple[Holder, ...] = ()
    if holders:
        listed = {p.pid for p in procs}
        # Only for holders the driver does not list: is it a CUDA program or a monitor?
        held = tuple(
            h if h.pid in listed else replace(h, device_mapped=source.device_mapped(h.pid))
            for h in source.holders(backend.device_files(), exclude=(me,), only=holder_pids)
        )
    return Snapshot(
        taken_at=taken_at,
        backend=backend.name,
        driver_version=backend.driver_version(),
        gpus=views,
        holders=held,
        in_child_namespace=source.in_child_namespace,
        observer_pid=me,
        warnings=tuple(backend.warnings),
    )
