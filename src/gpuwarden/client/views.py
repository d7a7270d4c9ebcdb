"""Typed views of the API's JSON answers, for mypy alone: the job document that
``daemon/jobjson.py`` builds (and so is checked against) and that ``show``, ``ps``,
``top`` and the Ray launcher read. Nothing is checked at run time, and nothing here
changes what goes over the wire; a reader of an older daemon's answer still uses
``.get`` where a field may be missing."""

from __future__ import annotations

from typing import Any, TypedDict


class ArrayDoc(TypedDict):
    """A task's place in its array (``--array``)."""

    id: int
    index: int
    limit: int | None
    task: str  # the task's reference, ``ARRAY%INDEX``


class OomDoc(TypedDict):
    """How the latest OOM retry was sized."""

    tried: int | None  # the allocation the OOM message said failed
    need: int | None  # what the job showed it needs per GPU
    retry_budget: int | None
    retry_ceiling: int | None


class EnforcementDoc(TypedDict):
    """Which layers of memory enforcement apply (``show``'s limit line)."""

    limit: int | None
    cooperative: str | None
    hard: str | None
    watchdog: str | None


class FairShareDoc(TypedDict):
    """A waiting job's user's decayed usage (byte-seconds) and its half-life."""

    usage: float
    halflife: float


class EstimateDoc(TypedDict):
    """What backfill expects of a job's run time (``show`` of a job not ended)."""

    seconds: float | None
    learned: float | None
    how: str


class _JobFields(TypedDict):
    id: int
    user: str
    uid: int
    name: str | None
    group: str | None
    key: str | None
    state: str
    command: list[str]
    cwd: str
    gpus: list[int]  # physical indices, once reserved
    gpu_uuids: list[str]
    gpu_count: int  # GPUs asked for
    gpu_ids: list[int] | None  # only these GPUs
    mem: int | None  # bytes per GPU declared; None: a whole GPU
    budget: int | None  # bytes reserved per GPU
    context: int | None  # CUDA context booked beside the budget
    peak_memory: int | None
    exclusive: bool
    priority: int
    qos: str
    mem_limit: int | None
    request: int | None  # the per-GPU request now (an OOM retry's, else mem)
    grace: float | None
    retries: int
    no_requeue: bool
    requeue_on_reboot: bool
    checkpoint: bool
    mps: bool
    mem_auto: bool
    cpus: int | None
    no_numa: bool
    mig: str | None
    attach: str | None  # who started it, for an attached job
    service: dict[str, Any] | None  # jobs/services.py's Service.to_json
    notify: str | None
    array: ArrayDoc | None
    restarts: int
    health_failures: int
    cpu_set: list[int]
    allocated_peak: int | None
    declared_vs_peak: str | None
    oom_end: str | None
    sm_percent: int | None
    after: list[int]
    after_any: list[int]
    after_fail: list[int]
    timeout: float | None
    exit_code: int | None
    submitted_at: str  # ISO 8601 UTC, as every time
    started_at: str | None
    ended_at: str | None
    reason: str | None
    attempts: int
    preemptions: int
    oom_retries: int
    oom: OomDoc | None
    preempting: bool
    enforcement: EnforcementDoc
    memory_release: dict[str, Any] | None  # jobs/model.py's Hold.to_json
    not_before: str | None
    events: list[dict[str, Any]]  # {"at", "kind", "detail"}


class JobDoc(_JobFields, total=False):
    """One job as the API answers it (``GET /v1/jobs/ID``, each of ``GET /v1/jobs``'s
    ``jobs``): these keys only where they apply."""

    env: dict[str, str]  # to its owner and admins alone
    fair_share: FairShareDoc  # a waiting job's, where fair share is on
    estimate: EstimateDoc  # ``GET /v1/jobs/ID`` of a job not ended


class JobPage(TypedDict):
    """One page of ``GET /v1/jobs``: ``more`` when further jobs match."""

    jobs: list[JobDoc]
    more: bool
