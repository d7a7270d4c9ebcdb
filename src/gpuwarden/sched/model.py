"""Inputs and decisions of placement: plain values, so policies test without processes."""

from __future__ import annotations

from dataclasses import dataclass

# The classes are the job request's (jobs/request.py); their ranks are policy.
from gpuwarden.jobs.request import BESTEFFORT, BURSTABLE, GUARANTEED

QOS_RANK = {BESTEFFORT: 0, BURSTABLE: 1, GUARANTEED: 2}
"""Higher ranks go first and may preempt lower ones; guaranteed jobs are never preempted."""


@dataclass(frozen=True)
class ManagedUse:
    """A reserved or running managed job's claim on one GPU. The fields past ``exclusive``
    feed the policies: who holds it (user limits), its class and priority (preemption),
    when it started, must end and is expected to end (backfill), what it uses now (over
    its request?), whether it is already being preempted, and whether it is the memory of
    an attempt that ended (a hold: it comes back any moment, unless it leaked)."""

    job_id: int
    budget: int  # bytes its allocations may hold (the --mem semantics)
    exclusive: bool = False
    user: str = ""
    qos: str = BURSTABLE
    priority: int = 0
    started_at: float | None = None
    ends_at: float | None = None  # start + timeout; None: unknown (runs until it ends)
    expected_end: float | None = None  # start + estimate: expected, not a bound
    used: int | None = None  # bytes the job's processes use on this GPU now
    preempting: bool = False
    context: int = 0  # the CUDA context allowance booked beside the budget
    ended: bool = False  # an ended attempt whose memory is not back yet: back any moment
    service: bool = False  # a long-running service (--restart): its neighbours slow it

    @property
    def booked(self) -> int:
        """What the claim takes from the GPU: budget plus context, or what the job's
        processes use (the driver's figure, context included) when that is more."""
        return max(self.budget + self.context, self.used or 0)


@dataclass(frozen=True)
class GpuState:
    """One GPU as placement sees it."""

    index: int
    uuid: str
    total: int
    reserve: int = 0  # driver reserve never given to jobs
    context: int = 0  # a CUDA context's allowance here, booked beside each job's budget
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] = ()
    compute_mode: str = "Default"
    managed: tuple[ManagedUse, ...] = ()
    foreign_peak: int = 0  # bytes used by processes gpuwarden does not manage, at their peak
    foreign_processes: int = 0
    foreign_users: frozenset[str] = frozenset()  # owners of those processes
    local_cpus: frozenset[int] | None = None  # CPUs near this GPU (None: unknown)
    free_cpus: frozenset[int] | None = None  # of those, not held alone by a job (--cpus)
    drained: str | None = None  # drained by an admin: why ("" without a reason); no placement
    mig: str | None = None  # a MIG instance of GPU ``index`` (profile; uuid its MIG- UUID)


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for GPUs, as the queue policy sees it."""

    id: int
    user: str
    mem: int | None  # bytes per GPU; None: a whole idle GPU
    mem_ceiling: int | None = None  # more it may take where there is room (an OOM retry)
    wait_for_ceiling: bool = False  # it waits for its ceiling on GPUs where jobs may end
    count: int = 1
    gpu_ids: tuple[int, ...] | None = None
    exclusive: bool = False
    priority: int = 0
    submitted_at: float = 0.0
    qos: str = BURSTABLE
    runtime: float | None = None  # the job's --timeout: the longest it may run
    estimate: float | None = None  # how long it is expected to run (learned): may be wrong
    not_before: float = 0.0  # epoch seconds; a retry waits out its backoff
    cpus: int | None = None  # CPU cores near its GPUs to hold alone (--cpus N)
    prefer: tuple[int, ...] | None = None  # a restarted service's GPUs: taken while it fits
    returning: bool = False  # a service queued again after it ended: it keeps its room
    mig: str | None = None  # only a MIG instance of this profile (e.g. "3g.40gb")
    mps: bool = False  # an MPS client: never on a MIG instance (no MPS server there)
    fair_usage: float = 0.0  # its user's decayed usage, byte-seconds (sched/fairshare.py)
    service: bool = False  # a long-running service (--restart): keeps off others' work

    @property
    def expected_runtime(self) -> float | None:
        """What backfill plans with: the estimate, or the timeout when that is shorter (the
        job is stopped by then); None: unknown."""
        known = [t for t in (self.estimate, self.runtime) if t is not None]
        return min(known) if known else None

    @property
    def alone(self) -> bool:
        """The job takes its GPUs alone: it asked to, or it wants whole GPUs."""
        return self.exclusive or self.mem is None


@dataclass(frozen=True)
class Place:
    """Decision: reserve ``budget`` bytes on each of ``gpus`` for the job, then launch."""

    job_id: int
    gpus: tuple[int, ...]
    budget: int
    cpus: tuple[int, ...] = ()  # the cores it holds alone, when it asked for some
    uuids: tuple[str, ...] = ()  # the places' uuids, as gpus: a MIG instance's MIG- UUID


@dataclass(frozen=True)
class Wait:
    """Decision: the job stays queued; ``reason`` says why (shown to the user). ``cause``
    sorts it: "room" (no GPU has the memory now), "limit" (its user's limits), "backoff"
    (a retry waits out its delay), "backfill" (it would delay the first waiting job),
    "preemption" (it waits for preempted jobs to stop)."""

    job_id: int
    reason: str
    cause: str = "room"


@dataclass(frozen=True)
class Infeasible:
    """Decision: the job can never run here, even on empty GPUs."""

    job_id: int
    reason: str


@dataclass(frozen=True)
class Preempt:
    """Decision: stop ``victims`` (job ids) so that ``job_id`` can be placed; the job
    itself waits until they are gone."""

    job_id: int
    victims: tuple[int, ...]
    reason: str


Decision = Place | Wait | Infeasible | Preempt
