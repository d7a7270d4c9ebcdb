"""A submit request's body turned into a ``JobSpec``, or refused with the reason. Each
field's own check comes from the table of request fields (jobs/request.py); what is here
are the rules between fields and those of this daemon, kept in one place so that submit
and edit refuse the same requests."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.envsnap import snapshot_env
from gpuwarden.daemon.restart import service_from_request
from gpuwarden.daemon.usercmd import checked_command
from gpuwarden.errors import UsageError
from gpuwarden.jobs.model import JobSpec
from gpuwarden.jobs.request import BESTEFFORT, FIELDS, GUARANTEED, check_fields
from gpuwarden.jobs.services import Service
from gpuwarden.units import bounded_size, parse_size_or_fraction


def spec_from_request(
    body: Mapping[str, Any],
    caller: Caller,
    gpu_count: int,
    *,
    capacities: Mapping[int, int] | None = None,
    oom_retries: int = 0,
    max_grace: float = math.inf,
) -> tuple[JobSpec, list[str]]:
    """Validate a submit request into a JobSpec; returns the env names dropped. Each
    field's type and bounds come from the table of request fields (jobs/request.py);
    the rules here are those between fields, or of this daemon.
    ``capacities`` (GPU index -> what it can give one job) turns a fractional ``mem``
    (``0.5`` of a GPU) into bytes. ``oom_retries``: the retries of a job with a budget
    that does not ask for a number (the daemon's ``oom_retries``); ``max_grace``: the
    longest ``grace`` allowed (the daemon's ``max_grace``)."""
    if not isinstance(body, Mapping):
        raise UsageError("the request body must be a JSON object")
    v = check_fields(body)
    attach = v["attach"]
    if attach is not None:
        from gpuwarden.daemon.attached import refuse_clashes

        refuse_clashes(body)
    raw_env = v["env"]
    bad_env = sorted(k for k, x in raw_env.items() if not k or "=" in k or "\0" in k + x)
    if bad_env:  # execve would refuse them: the job could never start
        raise UsageError(f"invalid environment variable(s): {', '.join(map(repr, bad_env))}")
    env, dropped = snapshot_env(raw_env, v["env_keep"])
    mem_auto = v["mem"] == "auto"
    mem = None if mem_auto else _mem(v["mem"], v["gpu_ids"], capacities or {})
    if mem_auto and v["key"] is None and v["name"] is None:
        raise UsageError("mem auto learns from earlier runs with the same key or name: give one")
    mem_limit = _size(v["mem_limit"], "mem_limit")
    qos = v["qos"]
    if mem_limit is not None:
        if mem is None and not mem_auto:
            raise UsageError(
                "mem_limit needs mem: the limit is how far past its request a job may grow"
            )
        if mem is not None and mem_limit < mem:
            raise UsageError("mem_limit must be at least mem")
        if qos == GUARANTEED and mem_limit != mem:
            raise UsageError("a guaranteed job is capped at its request: drop mem_limit")
    if qos == BESTEFFORT and v["exclusive"]:
        raise UsageError("a besteffort job cannot hold GPUs exclusively")
    grace = v["grace"]
    if grace is not None and grace > max_grace:  # SIGTERM-trapping jobs would never end
        raise UsageError(f"grace must be at most {max_grace:g}s (the daemon's max_grace)")
    if v["sm_percent"] is not None and not v["mps"]:
        raise UsageError("sm_percent needs mps: only MPS can share a GPU's SMs")
    if v["mps"] and mem is None and not mem_auto:
        raise UsageError("mps needs mem: the budget is the limit MPS enforces")
    retries = v["retries"]
    if retries is None:  # a whole GPU cannot grow
        retries = oom_retries if (mem is not None or mem_auto) and attach is None else 0
    if v["cpus"] is not None and v["no_numa"]:
        raise UsageError(
            "cpus binds the job to cores near its GPUs; no_numa turns binding off: choose one"
        )
    mig = v["mig"]
    if mig is not None:
        from gpuwarden.gpus.model import MIG_PROFILE

        if not MIG_PROFILE.match(mig):
            raise UsageError(f"mig: {mig!r} is not a MIG profile such as 1g.10gb or 3g.40gb")
        if v["mps"]:
            raise UsageError("mps and mig: gpuwarden runs no MPS server on a MIG instance")
    gpu_ids = v["gpu_ids"]
    if gpu_ids is not None:
        bad = [i for i in gpu_ids if i >= gpu_count]
        if bad:
            raise UsageError(
                f"no GPU with index {', '.join(map(str, bad))} (this machine has {gpu_count})"
            )
        gpu_ids = tuple(sorted(set(gpu_ids)))
    decided: dict[str, Any] = dict(
        user=caller.user,
        uid=caller.uid,
        gid=caller.gid,
        groups=caller.groups,
        env=env,
        mem=mem,
        gpu_ids=gpu_ids,
        qos=qos,
        mem_limit=mem_limit,
        grace=grace,
        # An attached job's launcher is gone once it is stopped: nothing could requeue it.
        no_requeue=v["no_requeue"] or attach is not None,
        retries=retries,
        mem_auto=mem_auto,
        mig=mig,
        service=_service(body, attach),
        notify=None if v["notify"] is None else checked_command(v["notify"], "notify"),
    )
    # Every stored field as its own check left it, unless a rule here decided it.
    spec = JobSpec(**{f.name: v[f.name] for f in FIELDS.values() if f.stored} | decided)
    return spec, dropped


def _service(body: Mapping[str, Any], attach: str | None) -> Service | None:
    svc = service_from_request(body)
    if svc is not None and attach is not None:
        raise UsageError(
            "restart: an attached job is started by its launcher, which restarts it or not"
        )
    return svc


def _size(raw: Any, label: str) -> int | None:
    return None if raw is None else bounded_size(raw, label, positive=True, example="14G")


def _mem(raw: Any, gpu_ids: tuple[int, ...] | None, capacities: Mapping[int, int]) -> int | None:
    """``mem`` as bytes: a size, or a fraction of what a GPU can give one job (its total
    less the reserve) -- of the smallest of the GPUs it may use, so that it fits on each."""
    if not isinstance(raw, str):
        return _size(raw, "mem")
    try:
        size, fraction = parse_size_or_fraction(raw)
    except UsageError as e:
        raise UsageError(f"mem: {e}") from None
    if fraction is None:
        return size
    allowed = gpu_ids or list(capacities)
    caps = [capacities[i] for i in allowed if i in capacities]
    if not caps:
        raise UsageError(
            f"mem: a fraction ({raw}) needs the daemon's view of the GPUs, "
            "which it does not have yet: give a size such as 20G"
        )
    return max(int(min(caps) * fraction), 1)
