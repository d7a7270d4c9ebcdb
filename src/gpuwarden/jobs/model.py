"""Jobs as the daemon stores and shows them. The JSON shape (``Job.to_json``) is part of
the interface: ``show --json`` prints it, ``ps --json`` prints a list of them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, overload

from gpuwarden.jobs import lifecycle
from gpuwarden.jobs.arrays import Member
from gpuwarden.jobs.request import BURSTABLE
from gpuwarden.units import format_bytes

if TYPE_CHECKING:
    from gpuwarden.jobs.services import Service

# The states as the daemon's modules name them (model.QUEUED), from the one table of
# states and events (jobs/lifecycle.py).
QUEUED, HELD, RESERVED, RUNNING = (
    lifecycle.QUEUED,
    lifecycle.HELD,
    lifecycle.RESERVED,
    lifecycle.RUNNING,
)
SUCCEEDED, FAILED, CANCELLED, INFEASIBLE = (
    lifecycle.SUCCEEDED,
    lifecycle.FAILED,
    lifecycle.CANCELLED,
    lifecycle.INFEASIBLE,
)
STATES, TERMINAL, ACTIVE = lifecycle.STATES, lifecycle.TERMINAL, lifecycle.ACTIVE
RESTARTED = lifecycle.RESTARTED

# Fields that describe one attempt: cleared whenever a job is queued again (an OOM or
# user retry, a requeue, a restart), so nothing of the last attempt (its GPUs, its
# supervisor, a watchdog's kill reason) is taken for the next one's.
FRESH_ATTEMPT: Mapping[str, Any] = MappingProxyType(
    dict(
        gpus=(),
        gpu_uuids=(),
        budget=None,
        supervisor_pid=None,
        supervisor_start=None,
        boot_id=None,
        started_at=None,
        exit_code=None,
        preempting_at=None,
        kill_reason=None,
        cpu_set=(),
        context=None,
    )
)


def fresh_attempt(job: Job) -> dict[str, Any]:
    """The fields of ``job`` queued again for a new attempt: the last one's cleared
    (``FRESH_ATTEMPT``), one attempt more counted."""
    return {**FRESH_ATTEMPT, "attempts": job.attempts + 1}


class _EnvNotRead(Mapping[str, str]):
    """The environment of a job listed without it (``Store.list(with_env=False)``):
    reading it fails loudly, so no job can start, or show, with an empty environment
    by mistake."""

    def _refuse(self) -> RuntimeError:
        return RuntimeError("this job was listed without its environment; read it again")

    def __getitem__(self, key: str) -> str:
        raise self._refuse()

    def __iter__(self) -> Iterator[str]:
        raise self._refuse()

    def __len__(self) -> int:
        raise self._refuse()

    def __repr__(self) -> str:
        return "ENV_NOT_READ"


ENV_NOT_READ: Mapping[str, str] = _EnvNotRead()


@overload
def iso(ts: float) -> str: ...
@overload
def iso(ts: None) -> None: ...
@overload
def iso(ts: float | None) -> str | None: ...
def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (the JSON form of every time); a time that is always
    set reads as a str to mypy too."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class JobSpec:
    """What a user asked for. Identity (uid, gid, groups) comes from the kernel
    (SO_PEERCRED and /proc), never from the request."""

    command: tuple[str, ...]
    user: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    cwd: str = "/"
    env: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    group: str | None = None
    key: str | None = None
    mem: int | None = None  # bytes per GPU; None: a whole idle GPU
    gpus: int = 1
    gpu_ids: tuple[int, ...] | None = None  # only these physical GPUs
    after: tuple[int, ...] = ()  # job ids that must succeed first
    after_any: tuple[int, ...] = ()  # job ids that must end first, however they end
    after_fail: tuple[int, ...] = ()  # job ids that must end without succeeding first
    timeout: float | None = None  # seconds
    exclusive: bool = False
    priority: int = 0
    requeue_on_reboot: bool = False
    qos: str = BURSTABLE  # one of request.QOS_CLASSES
    mem_limit: int | None = None  # bytes per GPU a burstable job may grow to (its cap)
    grace: float | None = None  # SIGTERM -> SIGKILL on cancel/preemption; None: config
    no_requeue: bool = False  # a preempted job ends cancelled instead of queued again
    retries: int = 0  # times a CUDA OOM may be retried with a bigger budget
    checkpoint: bool = False  # gets GPUWARDEN_PREEMPT_FILE, written before preemption
    mps: bool = False  # run as an MPS client with the budget as a hard limit
    sm_percent: int | None = None  # MPS: share of the GPU's SMs (1-100)
    mem_auto: bool = False  # mem was learned from earlier runs (--mem auto)
    cpus: int | None = None  # CPU cores near its GPUs held alone (--cpus N)
    no_numa: bool = False  # no CPU affinity, no NUMA memory binding
    mig: str | None = None  # a MIG instance of this profile (--mig 3g.40gb)
    attach: str | None = None  # started by another launcher (e.g. "ray job ID"), not us
    service: Service | None = None  # a restart policy and health check (--restart)
    notify: str | None = None  # run as the user, the job's JSON on stdin, once it ends
    array: Member | None = None  # a task of an array (--array), set when it is stored
    comment: str | None = None  # a note for whoever looks at the job (--comment)


@dataclass(frozen=True)
class Event:
    at: float
    kind: str
    detail: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"at": iso(self.at), "kind": self.kind, "detail": self.detail}


@dataclass(frozen=True)
class AttemptUse:
    """What a job's earlier attempts used, summed: GPU-seconds, and byte-seconds of
    memory reserved (budget) and used (peak) over their GPUs (``gpuwarden report``)."""

    gpu_seconds: float = 0.0
    reserved: float = 0.0
    used: float = 0.0


@dataclass(frozen=True)
class NewHold:
    """What an ending attempt leaves reserved (``Store.transition(hold=...)``)."""

    gpu_uuids: tuple[str, ...]
    budget: int
    pids: tuple[int, ...]
    baseline: dict[str, int]
    exited_at: float
    starts: dict[int, float] = field(default_factory=dict)  # pid -> its start time


CLEARED_BY = "cleared by "  # a hold's ``how`` when an admin released it (``unreserve``)


@dataclass(frozen=True)
class Hold:
    """GPU memory an ended attempt keeps reserved until it is verified back (invariant
    5): none of the attempt's processes is still listed on its GPUs and the memory no
    process accounts for did not grow. A leak keeps it open until the memory comes back
    or an admin clears it."""

    id: int
    job_id: int
    attempt: int
    gpu_uuids: tuple[str, ...]
    budget: int
    pids: tuple[int, ...]  # the attempt's processes, as last seen
    baseline: dict[str, int]  # GPU uuid -> unaccounted bytes last seen while it ran
    exited_at: float
    released_at: float | None = None
    how: str | None = None  # "verified", "cleared by NAME", "unverified: WHY"
    leak: str | None = None  # what was still there, once reported
    starts: dict[int, float] = field(default_factory=dict)  # pid -> start time, as seen

    @property
    def open(self) -> bool:
        return self.released_at is None

    @property
    def seconds(self) -> float | None:
        """From the end to the release, to the millisecond: the one figure the JSON and
        the words both give (rounded twice, they could differ in the last digit)."""
        return None if self.released_at is None else round(self.released_at - self.exited_at, 3)

    def said(self) -> str:
        """The release in words (``show``, the web UI): the memory came back, or an admin
        released the hold while it was still held, or it is still reserved."""
        if self.released_at is None:
            return "still reserved: not verified back since the end" + (
                f"; leak: {self.leak}" if self.leak else ""
            )
        took = f"{self.seconds:.2f} s after the end"
        if self.how is not None and self.how.startswith(CLEARED_BY):
            return (
                f"hold released by {self.how.removeprefix(CLEARED_BY)} {took}; the "
                "memory was not verified back" + (f": {self.leak}" if self.leak else "")
            )
        return f"memory back {took} ({self.how})"

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "gpu_uuids": list(self.gpu_uuids),
            "budget": self.budget,
            "exited_at": iso(self.exited_at),
            "released_at": iso(self.released_at),
            "seconds": self.seconds,
            "how": self.how,
            "leak": self.leak,
            "said": self.said(),
        }


@dataclass(frozen=True)
class Job:
    id: int
    spec: JobSpec
    state: str
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    gpus: tuple[int, ...] = ()  # physical indices, once reserved
    gpu_uuids: tuple[str, ...] = ()
    budget: int | None = None  # bytes reserved per GPU (the request, or the whole GPU)
    peak_memory: int | None = None  # bytes, summed over the job's process tree per GPU
    exit_code: int | None = None
    reason: str | None = None  # why it waits, failed or was cancelled
    supervisor_pid: int | None = None
    supervisor_start: float | None = None
    boot_id: str | None = None
    attempts: int = 0
    preempting_at: float | None = None  # preemption asked; its end is then a requeue
    preemptions: int = 0
    oom_retries: int = 0  # OOM retries used
    retry_mem: int | None = None  # the bumped per-GPU request after an OOM
    retry_ceiling: int | None = None  # the most that retry may take where there is room
    ceiling_until: float | None = None  # it waits for room for that ceiling until then
    oom_tried: int | None = None  # the allocation its latest OOM message says failed
    oom_need: int | None = None  # what that OOM showed it needs per GPU (message or peak)
    context: int | None = None  # CUDA context allowance booked beside its budget per GPU
    allocated_peak: int | None = None  # its allocator's peak, as the cap hook reported
    not_before: float | None = None  # a retry's backoff: not placed before this
    kill_reason: str | None = None  # why gpuwarden killed it (the watchdog), if it did
    release: Hold | None = None  # the memory of its latest ended attempt
    cpu_set: tuple[int, ...] = ()  # the cores it holds alone while reserved/running
    restarts: int = 0  # a service's restarts so far (its restart policy's)
    health_failures: int = 0  # a service's failed health checks so far
    earlier: AttemptUse = field(default_factory=lambda: AttemptUse())  # ended attempts
    events: tuple[Event, ...] = ()

    @property
    def allocations_peak(self) -> int | None:
        """What the job's allocations took at their peak, the figure ``--mem`` is
        compared with: its allocator's report, else the driver's peak less the CUDA
        context booked beside its budget."""
        if self.allocated_peak is not None:
            return self.allocated_peak
        if self.peak_memory is None:
            return None
        return max(self.peak_memory - (self.context or 0), 0)

    @property
    def ended_of_oom(self) -> bool:
        """Whether it failed and its latest attempt ended of a CUDA OOM (an ``oom`` event
        after its last placement)."""
        if self.state != FAILED:
            return False
        for e in reversed(self.events):
            if e.kind == "oom":
                return True
            if e.kind in ("placed", "retried", "requeued"):
                return False
        return False

    @property
    def returning(self) -> bool:
        """Whether it is a service queued again after it ended (a restart, an OOM retry),
        not after a preemption or a lost launch: it goes ahead of the queue and keeps its
        room (sched/queue.py, docs/services.md)."""
        if self.spec.service is None or self.state != QUEUED:
            return False
        for e in reversed(self.events):
            if e.kind in (RESTARTED, "retried"):
                return True
            if e.kind in ("placed", "requeued"):
                return False
        return False

    def oom_end(self) -> str | None:
        """For a job that failed of an OOM: that it ran out at its limit, and what its
        message asked for (``wait``, ``show``)."""
        if not self.ended_of_oom:
            return None
        limit = self.cap()
        said = "ran out of GPU memory " + (
            "on its whole GPU" if limit is None else f"at its limit {format_bytes(limit)}"
        )
        if self.oom_tried is None:
            return said + " (its message gave no size)"
        return (
            said
            + f": it tried to allocate {format_bytes(self.oom_tried)}"
            + (
                ""
                if self.oom_need is None or self.oom_need <= self.oom_tried
                else f" holding {format_bytes(self.oom_need - self.oom_tried)}"
            )
            + ("" if self.oom_need is None else f" (needs {format_bytes(self.oom_need)})")
        )

    def cap(self, budget: int | None = None) -> int | None:
        """The memory limit per GPU the job runs with, given its budget (default: the
        one it holds, else its request): burstable jobs may grow to ``--mem-limit``;
        every other job with a budget is held to it; whole-GPU jobs have none."""
        if self.request is None:
            return None
        base = budget if budget is not None else (self.budget or self.request)
        if self.spec.qos == "burstable" and self.spec.mem_limit is not None:
            return max(self.spec.mem_limit, base)
        return base

    @property
    def request(self) -> int | None:
        """Bytes per GPU placement asks for now: the bumped budget after an OOM, else
        what the user asked for."""
        return self.retry_mem if self.retry_mem is not None else self.spec.mem

    @property
    def user(self) -> str:
        return self.spec.user

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL
